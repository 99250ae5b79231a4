"""A worker paused past its lease is a zombie: its late commit is refused."""

import signal
import time

import pytest

from agentrun.models import Event, Snapshot, Step
from tests.base import calls, final, make_run, script
from tests.workers import PAUSED_ON_RABBITMQ, decided, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.durability,
    pytest.mark.skipif(bool(PAUSED_ON_RABBITMQ), reason=PAUSED_ON_RABBITMQ),
]


def test_a_zombie_workers_commit_is_refused_and_writes_nothing(start_worker, settings):
    # The worker first: it may take the run's messages before it says it is ready
    # (RabbitMQ hands them over at once), and the step must still be in flight here.
    zombie = start_worker()
    run = make_run(
        script(
            calls({"tool": "echo", "args": {"n": 1}}),
            calls({"tool": "sleep", "args": {"seconds": 2}}),
            calls({"tool": "echo", "args": {"n": 3}}),
            final("done"),
        )
    )
    # Step 2's decision is recorded right before its sleep call runs.
    wait_until(decided(run, 2), what="step 2 to start")
    zombie.signal(signal.SIGSTOP)
    owner = None
    for _ in range(50):
        run.refresh_from_db()
        owner = run.lease_owner
        if owner:
            break
        time.sleep(0.05)
    assert owner, "the zombie should hold the lease on step 2"

    # Past the lease, a healthy worker (with the reconciler) takes the step over and finishes the run.
    start_worker(beat=True)
    wait_until(
        lambda: run.refresh_from_db() or run.status == "succeeded",
        timeout=60,
        what="the healthy worker to finish the run",
    )
    step2 = Step.objects.get(run=run, number=2)
    post_hash = Snapshot.objects.get(run=run, step=2, at="post").hash
    events_before = Event.objects.filter(run=run).count()
    snapshots_before = Snapshot.objects.filter(run=run).count()

    zombie.signal(signal.SIGCONT)
    zombie.wait_for_log("lease lost", timeout=30)
    time.sleep(0.5)
    assert Snapshot.objects.get(run=run, step=2, at="post").hash == post_hash
    assert Snapshot.objects.filter(run=run).count() == snapshots_before
    assert Event.objects.filter(run=run).count() == events_before
    assert step2.attempts == 2
    run.refresh_from_db()
    assert run.status == "succeeded" and run.next_step == 5
