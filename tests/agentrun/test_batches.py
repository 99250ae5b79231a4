"""Replay batches in one process: select, preview, fork from before the failure, verdicts,
promotion, cancel, and bad input that changes nothing. (Real workers of two code versions:
test_batches_workers.py.)"""

from __future__ import annotations

import pytest

from agentrun.agents import get_agent
from agentrun.lifecycle import batches
from agentrun.lifecycle.batches import BatchError
from agentrun.models import BatchItem, Event, LedgerEntry, ReplayBatch, Run
from tests.base import drive
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db


FAILED = {"agent": "refunds", "status": "failed"}


def test_v1_fails_on_orders_without_items_and_records_its_version(on_v1):
    runs = incident()
    assert [r.status for r in runs] == ["failed"] * 3 + ["succeeded"] * 2
    assert "division by zero" in runs[0].error
    assert {r.code_version for r in runs} == {"v1"}
    assert set(runs[0].steps.values_list("code_version", flat=True)) == {"v1"}


def test_the_preview_says_which_runs_from_where_and_writes_nothing(on_v1):
    incident()
    plan = batches.plan(FAILED, "before-failure", "sandbox", "v2")
    assert plan.count == 3 and plan.skipped == 0
    assert {i.step for i in plan.items} == {2}  # the step whose policy failed
    assert ReplayBatch.objects.count() == 0 and Run.objects.count() == 5


def test_a_sandbox_batch_on_the_fixed_code_fixes_every_run_without_a_side_effect(
    on_v1, monkeypatch
):
    parents = incident()
    ledger = LedgerEntry.objects.count()
    deploy_v2(monkeypatch)
    batch = batches.create(FAILED, "before-failure", mode="sandbox", version="v2", name="refunds")
    batch = run_batch(batch)
    assert batch.status == "done"
    counts = batches.counts(batch)
    assert counts["verdicts"]["fixed"] == 3 and counts["runs"]["succeeded"] == 3
    assert LedgerEntry.objects.count() == ledger  # sandbox: the payments were not made
    forks = Run.objects.filter(batch=batch)
    assert {f.target_version for f in forks} == {"v2"} and {f.code_version for f in forks} == {"v2"}
    assert {f.parent_id for f in forks} == {p.pk for p in parents if p.status == "failed"}
    for parent in parents:  # the parents are untouched
        before = parent.status, parent.next_step, parent.error
        parent.refresh_from_db()
        assert (parent.status, parent.next_step, parent.error) == before


def test_promoting_it_pays_each_refund_exactly_once(on_v1, monkeypatch):
    incident()
    deploy_v2(monkeypatch)
    sandbox = run_batch(batches.create(FAILED, mode="sandbox", version="v2", name="refunds"))
    with pytest.raises(BatchError, match="confirm"):
        batches.promote(sandbox, user=None)
    assert ReplayBatch.objects.count() == 1
    live = batches.promote(sandbox, user=None, confirm_live=True)
    assert live.mode == "live" and live.promoted_from == sandbox
    live = run_batch(live)
    assert batches.counts(live)["verdicts"]["fixed"] == 3
    paid = LedgerEntry.objects.filter(run__batch=live)
    assert sorted(paid.values_list("account", flat=True)) == ["order-0", "order-1", "order-2"]
    for fork in Run.objects.filter(batch=live):  # driving again pays nothing more
        drive(fork)
    assert paid.count() == 3


def test_still_failing_when_the_code_is_not_fixed(on_v1):
    incident(n_failing=2, n_fine=0)
    batch = run_batch(batches.create(FAILED, mode="sandbox", name="not fixed yet"))
    assert batches.counts(batch)["verdicts"]["still_failing"] == 2


def test_unchanged_and_changed_side_effects_for_runs_that_succeeded(on_v1, monkeypatch):
    incident(n_failing=0, n_fine=2)
    fine = {"agent": "refunds", "status": "succeeded"}
    # A live replay pays again under its own keys: the same calls, so unchanged.
    batch = run_batch(batches.create(fine, "start", mode="live", name="again", confirm_live=True))
    assert batches.counts(batch)["verdicts"]["unchanged"] == 2
    # New code that pays another amount: the same outcome, other side effects.
    monkeypatch.setattr(get_agent("refunds"), "refund", lambda order: order["total"] + 1)
    sandbox = run_batch(batches.create(fine, "start", mode="sandbox", name="other amounts"))
    assert batches.counts(sandbox)["verdicts"]["changed_side_effects"] == 4


def test_runs_without_the_fork_point_are_listed_as_skipped_with_why(on_v1):
    incident(n_failing=1, n_fine=2)
    plan = batches.plan({"agent": "refunds"}, "before-failure")
    skipped = [i for i in plan.items if i.step is None]
    assert len(skipped) == 2 and {i.skip_reason for i in skipped} == {"no failed step"}
    plan = batches.plan({"agent": "refunds"}, {"tool": "ledger_write"})
    assert plan.count == 2 and plan.skipped == 1  # the failed run never paid
    plan = batches.plan({"agent": "refunds"}, {"step": 3})
    assert {i.skip_reason for i in plan.items if i.step is None} == {"no pre snapshot of step 3"}


def test_at_most_max_in_flight_forks_and_cancel_stops_new_ones(on_v1, monkeypatch):
    incident(n_failing=3, n_fine=0)
    deploy_v2(monkeypatch)
    batch = batches.create(FAILED, mode="sandbox", name="slowly", max_in_flight=1)
    batches.advance(batch.pk)
    batches.advance(batch.pk)
    assert Run.objects.filter(batch=batch).count() == 1
    batches.cancel(batch, user=None, reason="enough")
    batch = run_batch(batch)
    assert batch.status == "cancelled"
    counts = batches.counts(batch)
    assert counts["runs"]["skipped"] == 2 and counts["verdicts"]["fixed"] == 1
    assert Event.objects.filter(kind="batch_cancelled", reason="enough").exists()
    with pytest.raises(BatchError, match="only a running batch"):
        batches.cancel(batch, user=None)


@pytest.mark.parametrize(
    "kwargs, field, message",
    [
        ({"filter": {"colour": "red"}}, "filter", "unknown filter field 'colour'"),
        ({"filter": {"status": "exploded"}}, "filter", "status must be one of"),
        ({"version": None}, None, None),  # none: any worker (valid)
        ({"version": ""}, "version", "can't be empty"),
        ({"version": "v" * 65}, "version", "at most 64 characters"),
        ({"version": "has space"}, "version", "letters, digits"),
        ({"start_from": "middle"}, "from", "from must be"),
        ({"start_from": {"step": 0}}, "from", "step number"),
        ({"mode": "reckless"}, "mode", "mode must be one of"),
        ({"name": "  "}, "name", "needs a name"),
        ({"max_in_flight": 0}, "max_in_flight", "1 to 10000"),
        ({"filter": {"agent": "nobody"}}, "filter", "the filter selects no run"),
        ({"start_from": {"tool": "no_such_tool"}}, "filter", "none of the 2 selected runs"),
        ({"mode": "live"}, "confirm_live", "confirm it"),
    ],
)
def test_bad_input_is_refused_clearly_and_creates_nothing(on_v1, kwargs, field, message):
    incident(n_failing=2, n_fine=0)
    args = {"filter": FAILED, "start_from": "start", "name": "x", "mode": "sandbox", **kwargs}
    filter_ = args.pop("filter")
    if message is None:
        batches.create(filter_, **args)
        return
    with pytest.raises(BatchError, match=message) as caught:
        batches.create(filter_, **args)
    assert caught.value.field == field
    assert ReplayBatch.objects.count() == 0 and BatchItem.objects.count() == 0
    assert Run.objects.count() == 2 and not Event.objects.filter(kind="batch_created").exists()
