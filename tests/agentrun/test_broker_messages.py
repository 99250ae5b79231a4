"""The broker is only a wake-up: duplicated or lost messages change nothing."""

import pytest

from agentrun.models import LedgerInvocation, Run, Snapshot, Step
from agentrun.tasks import execute_step_task
from tests.base import calls, final, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]


def _settled(run):
    def check():
        run.refresh_from_db()
        return run.status in ("succeeded", "failed", "cancelled", "waiting")

    return check


def test_a_duplicated_step_message_commits_the_step_once(start_worker, settings):
    settings.AGENTRUN_ENQUEUE = False  # only our duplicates wake the workers
    run = make_run(
        script(
            calls(
                {"tool": "sleep", "args": {"seconds": 0.5}},
                {"tool": "ledger_write", "args": {"account": "dup", "amount": 1}},
            ),
            final("once"),
        )
    )
    for _ in range(6):
        execute_step_task.delay(str(run.pk), 1)
    start_worker(concurrency=2)
    start_worker(concurrency=1)
    wait_until(
        lambda: Step.objects.filter(run=run, number=1, status="succeeded").exists(),
        timeout=60,
        what="step 1 to commit",
    )
    execute_step_task.delay(str(run.pk), 2)
    execute_step_task.delay(str(run.pk), 2)
    wait_until(_settled(run), timeout=60, what="the run to finish")
    assert run.status == "succeeded"
    assert Snapshot.objects.filter(run=run, step=1).count() == 2
    assert Step.objects.get(run=run, number=1).decision_count == 1
    assert list(LedgerInvocation.objects.filter(run=run).values_list("count", flat=True)) == [1]


def test_a_lost_message_is_recovered_by_the_reconciler(start_worker, settings):
    settings.AGENTRUN_ENQUEUE = False  # the run's first message is never sent
    run = make_run(script(calls({"tool": "echo", "args": {"lost": True}}), final("found")))
    start_worker(beat=True)
    wait_until(_settled(run), timeout=60, what="the reconciler to start the run")
    assert run.status == "succeeded"
    assert Run.objects.get(pk=run.pk).final_answer == "found"
