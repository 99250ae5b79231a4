"""Runs that wait for an operator, through a real worker: in-doubt calls,
approvals, rejections, cancellation with compensation, retries with backoff."""

import pytest

from agentrun.lifecycle import services
from agentrun.models import InventoryItem, OutboxMessage, Reservation, Step, ToolCall
from tests.base import calls, final, make_people, make_run, script
from tests.workers import decided, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]


def _settled(run, *statuses):
    statuses = statuses or ("succeeded", "failed", "cancelled", "waiting")

    def check():
        run.refresh_from_db()
        return run.status in statuses

    return check


def test_a_notify_call_left_in_doubt_waits_for_an_operator_instead_of_repeating(start_worker):
    olga = make_people()["operator"]
    # The worker first: the fault may kill it before it says it is ready otherwise.
    worker = start_worker(beat=True)
    run = make_run(
        script(
            calls(
                {
                    "tool": "notify",
                    "args": {"to": "ana@example.com", "body": "shipped"},
                    "fault": "crash_after",
                }
            ),
            final("told"),
        )
    )
    assert worker.proc.wait(timeout=60) == 71  # the fault killed it after the send
    start_worker(beat=True)  # as a supervisor would
    wait_until(_settled(run), timeout=60, what="the run to stop")
    assert (run.status, run.wait_reason) == ("waiting", "in_doubt")
    assert OutboxMessage.objects.filter(run=run).count() == 1
    assert ToolCall.objects.get(run=run, tool="notify").status == "in_doubt"

    services.decide_approval(
        run,
        user=olga,
        decision="approve",
        resolution="mark_done",
        comment="checked the outbox: it was sent",
    )
    wait_until(_settled(run, "succeeded", "failed"), timeout=60, what="the run to finish")
    assert run.status == "succeeded"
    assert OutboxMessage.objects.filter(run=run).count() == 1


def test_approval_pauses_the_run_and_approve_resumes_it(start_worker):
    olga = make_people()["operator"]
    run = make_run(
        script(
            calls(
                {
                    "tool": "ledger_write",
                    "args": {"account": "acme", "amount": 99},
                    "approval": True,
                }
            ),
            final("paid"),
        )
    )
    start_worker()
    wait_until(_settled(run), timeout=60, what="the approval pause")
    assert (run.status, run.wait_reason) == ("waiting", "approval")
    assert ToolCall.objects.get(run=run).status == "awaiting_approval"
    services.decide_approval(run, user=olga, decision="approve", comment="ok")
    wait_until(_settled(run, "succeeded", "failed"), timeout=60, what="the run to finish")
    assert run.status == "succeeded"
    assert ToolCall.objects.get(run=run).approval["by"] == "olga"


def test_reject_fails_the_run_and_compensates_its_reservations(start_worker):
    olga = make_people()["operator"]
    run = make_run(
        script(
            calls({"tool": "reserve", "args": {"sku": "lamp", "qty": 2}}),
            calls(
                {
                    "tool": "ledger_write",
                    "args": {"account": "acme", "amount": 40},
                    "approval": True,
                }
            ),
            final("bought"),
        )
    )
    start_worker()
    wait_until(_settled(run), timeout=60, what="the approval pause")
    assert InventoryItem.objects.get(sku="lamp").reserved == 2
    services.decide_approval(run, user=olga, decision="reject", comment="too expensive")
    wait_until(_settled(run, "succeeded", "failed"), timeout=60, what="the run to fail")
    assert run.status == "failed" and "rejected by olga" in run.error
    # Compensation follows the failure's commit. The compensating action releases the
    # reservation in its own transaction; the call is marked compensated after it returns,
    # so the test waits for the mark, which comes last.
    reserve = ToolCall.objects.filter(run=run, tool="reserve")
    wait_until(
        lambda: reserve.get().status == "compensated", timeout=30, what="the compensation's mark"
    )
    assert Reservation.objects.get(run=run).released
    assert InventoryItem.objects.get(sku="lamp").reserved == 0


def test_cancel_compensates_the_reservations_in_reverse_order(start_worker):
    olga = make_people()["operator"]
    run = make_run(
        script(
            calls(
                {"tool": "reserve", "args": {"sku": "desk", "qty": 1}},
                {"tool": "reserve", "args": {"sku": "chair", "qty": 4}},
            ),
            calls({"tool": "sleep", "args": {"seconds": 30}}),
            final("furnished"),
        )
    )
    start_worker()
    wait_until(decided(run, 2), what="step 2")
    services.cancel_run(run, user=olga, reason="customer called")
    assert run.status == "cancelled"
    held = Reservation.objects.filter(run=run).order_by("released_at")
    assert [r.sku for r in held] == ["chair", "desk"] and all(r.released for r in held)
    assert InventoryItem.objects.get(sku="chair").reserved == 0
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_transient_failures_are_retried_with_backoff_recorded_per_attempt(start_worker):
    run = make_run(script(calls({"tool": "flaky", "args": {"failures": 2}}), final("eventually")))
    start_worker(beat=True)
    wait_until(_settled(run, "succeeded", "failed"), timeout=60, what="the run to finish")
    assert run.status == "succeeded"
    attempts = ToolCall.objects.get(run=run).attempts
    assert len(attempts) == 3
    assert [bool(a["error"]) for a in attempts] == [True, True, False]
    assert attempts[0]["backoff_s"] < attempts[1]["backoff_s"]
    assert Step.objects.get(run=run, number=1).decision_count == 1
