"""A worker that dies mid-step loses nothing and repeats nothing."""

import signal
import time

import pytest

from agentrun.models import LedgerEntry, LedgerInvocation, Run, Step, ToolCall
from tests.base import calls, final, make_run, script
from tests.workers import decided, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]


def _finished(run):
    def check():
        run.refresh_from_db()
        return run.status in ("succeeded", "failed", "cancelled", "waiting") and run

    return check


def _assert_exactly_once(run: Run) -> None:
    for step in Step.objects.filter(run=run):
        assert step.decision_count == 1, f"step {step.number} decided {step.decision_count} times"
    keys = list(
        ToolCall.objects.filter(run=run, tool="ledger_write").values_list(
            "idempotency_key", flat=True
        )
    )
    assert keys
    for key in keys:
        assert LedgerEntry.objects.filter(idempotency_key=key).count() == 1


def test_it_resumes_after_the_worker_is_killed_mid_step(start_worker):
    # The worker first: it may take the run's messages before it says it is ready
    # (RabbitMQ hands them over at once), and the step must still be in flight here.
    first = start_worker(beat=True)
    run = make_run(
        script(
            calls({"tool": "ledger_write", "args": {"account": "acme", "amount": 10}}),
            calls(
                {"tool": "sleep", "args": {"seconds": 3}},
                {"tool": "ledger_write", "args": {"account": "acme", "amount": 20}},
            ),
            final("paid twice"),
        )
    )
    # Step 2's decision is recorded just before its sleep call runs for 3 s.
    wait_until(decided(run, 2), what="step 2")
    time.sleep(0.5)
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)

    start_worker(beat=True)
    wait_until(_finished(run), timeout=90, what="the run to finish")
    assert run.status == "succeeded", run.error
    assert Step.objects.get(run=run, number=2).attempts == 2
    _assert_exactly_once(run)


@pytest.mark.parametrize("fault", ["crash_before", "crash_after"])
def test_a_fault_point_kills_the_worker_and_the_run_completes(start_worker, fault):
    # The worker first: the fault may kill it before it says it is ready otherwise.
    worker = start_worker(beat=True)
    run = make_run(
        script(
            calls({"tool": "echo", "args": {"n": 1}}),
            calls(
                {"tool": "ledger_write", "args": {"account": "acme", "amount": 5}, "fault": fault}
            ),
            final("ok"),
        )
    )
    # The fault kills the worker process (every step in flight in it); a supervisor
    # (systemd, Kubernetes) would start it again.
    assert worker.proc.wait(timeout=40) == (70 if fault == "crash_before" else 71)
    replacement = start_worker(beat=True)
    try:
        wait_until(_finished(run), timeout=40, what="the run to finish")
    except TimeoutError:
        print(replacement.text()[-6000:])
        print(Run.objects.filter(pk=run.pk).values().first())
        print(list(ToolCall.objects.filter(run=run).values("tool", "status", "attempts")))
        raise
    assert run.status == "succeeded", run.error
    _assert_exactly_once(run)
    key = ToolCall.objects.get(run=run, tool="ledger_write").idempotency_key
    invocations = LedgerInvocation.objects.get(idempotency_key=key).count
    # crash_before dies before the tool runs; crash_after after it ran once, so the retry is a duplicate.
    assert invocations == (1 if fault == "crash_before" else 2)
    attempts = ToolCall.objects.get(run=run, tool="ledger_write").attempts
    assert attempts[0]["fault"] == fault and len(attempts) == 2
