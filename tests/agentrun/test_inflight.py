"""What is in flight now, derived from the runs' and steps' rows (agentrun.engine.inflight)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentrun import engine
from agentrun.engine import inflight
from agentrun.models import Run, Step
from agentrun.tools import ToolContext, tool
from tests.base import calls, drive, final, make_in_flight, make_run, script

pytestmark = pytest.mark.django_db

SEEN: list[inflight.InFlight] = []


# timeout=0: the tool runs in the engine's own thread, so it sees the test's transaction.
@tool(name="test_inflight_probe", kind="write", idempotent=True, timeout=0)
def probe(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Looks at what is in flight from inside a running tool call."""
    SEEN.append(inflight.snapshot())
    return {"ok": True}


def only(snap: inflight.InFlight, state: str) -> inflight.Item:
    [group] = [g for g in snap.groups if g.state.key == state]
    [item] = group.items
    return item


def test_a_claimed_step_without_a_decision_is_deciding_on_its_worker():
    run = make_run(script(calls({"tool": "echo", "args": {}}), final()))
    assert engine.claim(str(run.pk), 1, "web-3:4242:0badcafe") is not None

    snap = inflight.snapshot()
    item = only(snap, "deciding")
    assert (item.run_id, item.step, item.worker) == (run.pk, 1, "web-3:4242")
    assert item.lease_owner == "web-3:4242:0badcafe" and item.step_id is not None
    assert 0 <= item.waited_s < 60
    assert snap.counts["deciding"] == 1 and snap.in_flight == 1


def test_a_step_inside_its_tool_call_is_on_a_tool_with_that_call_running():
    SEEN.clear()
    run = make_run(
        script(
            calls({"tool": "echo", "args": {}}, {"tool": "test_inflight_probe", "args": {}}),
            final(),
        )
    )
    engine.execute_step(run.pk, 1, "web-3:77:feedf00d")

    [snap] = SEEN
    item = only(snap, "acting")
    assert item.worker == "web-3:77" and item.tools == ("echo", "test_inflight_probe")
    assert item.call is not None
    assert (item.call.tool, item.call.index, item.call.running) == ("test_inflight_probe", 1, True)
    step = Step.objects.get(run=run, number=1)
    assert item.since >= step.decided_at
    run.refresh_from_db()
    assert inflight.counts()["queued"] == 1  # committed and handed back: between steps


def test_a_transient_failure_is_in_backoff_until_its_wake_up_time():
    run = drive(make_run(script(calls({"tool": "flaky", "args": {"failures": 2}}), final())))
    assert (run.status, run.wait_reason) == ("waiting", "backoff")

    snap = inflight.snapshot()
    item = only(snap, "backoff")
    assert item.wake_at == run.wake_at
    assert item.wake_in_s == pytest.approx((run.wake_at - snap.now).total_seconds())
    assert item.worker == "" and item.tools == ("flaky",)
    assert item.call is not None and item.call.tool == "flaky"
    assert "simulated timeout" in item.call.error and item.call.attempt == 1


def test_a_call_that_needs_approval_waits_for_approval_on_that_call():
    run = drive(
        make_run(
            script(calls({"tool": "reserve", "args": {"sku": "A", "qty": 1}, "approval": True}))
        )
    )
    assert (run.status, run.wait_reason) == ("waiting", "approval")

    item = only(inflight.snapshot(), "approval")
    assert item.run_id == run.pk and item.worker == ""
    assert item.call is not None
    assert (item.call.tool, item.call.status) == ("reserve", "awaiting_approval")


def test_a_run_nobody_has_claimed_yet_is_queued_without_a_step():
    run = make_run()
    item = only(inflight.snapshot(state="queued"), "queued")
    assert (item.run_id, item.step, item.step_id, item.worker) == (run.pk, 1, None, "")
    assert inflight.snapshot().in_flight == 0


def test_a_call_left_in_doubt_waits_for_an_operator():
    [run] = make_in_flight("in_doubt", waited=90)
    item = only(inflight.snapshot(), "in_doubt")
    assert item.run_id == run.pk and item.worker == "" and 90 <= item.waited_s < 150
    assert item.call is not None and item.call.status == "in_doubt"


def test_a_run_whose_lease_ran_out_is_stalled_since_the_expiry():
    [run] = make_in_flight("stalled", waited=40, worker="web-9:13")
    item = only(inflight.snapshot(), "stalled")
    assert item.worker == "web-9:13" and item.since == run.lease_expires_at
    assert 40 <= item.waited_s < 100


def test_finished_runs_are_not_in_flight():
    drive(make_run())
    make_in_flight("acting")
    Run.objects.filter(status="running").update(status="cancelled")
    snap = inflight.snapshot()
    assert snap.total == 0 and snap.workers == [] and all(g.count == 0 for g in snap.groups)


def test_every_state_is_counted_overall_and_per_worker():
    make_in_flight("deciding", 3, worker="w-a:1")
    make_in_flight("acting", 2, worker="w-a:1")
    make_in_flight("acting", 4, worker="w-b:2")
    make_in_flight("stalled", 1, worker="w-b:2")
    for state in ("backoff", "approval", "crashed", "in_doubt", "queued"):
        make_in_flight(state, 2)

    snap = inflight.snapshot()
    expected = {
        "deciding": 3,
        "acting": 6,
        "backoff": 2,
        "approval": 2,
        "crashed": 2,
        "in_doubt": 2,
        "stalled": 1,
        "queued": 2,
    }
    assert snap.counts == expected == inflight.counts()
    assert snap.total == 20 and snap.in_flight == 18
    assert [(w.worker, w.counts) for w in snap.workers] == [
        ("w-a:1", {"deciding": 3, "acting": 2}),
        ("w-b:2", {"acting": 4, "stalled": 1}),
        ("", {"backoff": 2, "approval": 2, "crashed": 2, "in_doubt": 2, "queued": 2}),
    ]


def test_each_state_lists_its_longest_waits_first_up_to_the_limit():
    runs = {
        waited: make_in_flight("acting", waited=waited)[0] for waited in (3, 70, 12, 400, 1, 25, 9)
    }
    group = inflight.snapshot(limit=3).groups[1]
    assert group.state.key == "acting" and group.count == 7 and group.more == 4
    assert [i.run_id for i in group.items] == [runs[400].pk, runs[70].pk, runs[25].pk]
    assert group.items[0].waited_s >= 400


def test_queued_runs_are_mostly_a_count_unless_asked_for():
    make_in_flight("queued", 8)
    [queued] = [g for g in inflight.snapshot().groups if g.state.key == "queued"]
    assert queued.count == 8 and len(queued.items) == inflight.QUEUED_SHOWN
    [asked] = inflight.snapshot(state="queued").groups
    assert len(asked.items) == 8


def test_filters_narrow_the_lists_but_not_the_counts_or_the_matrix():
    make_in_flight("acting", 2, worker="w-a:1")
    make_in_flight("acting", 3, worker="w-b:2")
    make_in_flight("approval", 1)

    snap = inflight.snapshot(worker="w-b:2", state="acting")
    [group] = snap.groups
    assert group.count == 3 and {i.worker for i in group.items} == {"w-b:2"}
    assert snap.counts["acting"] == 5 and len(snap.workers) == 3
    parked = inflight.snapshot(worker=inflight.NO_WORKER)
    assert {g.state.key: g.count for g in parked.groups if g.count} == {"approval": 1}
    with pytest.raises(ValueError, match="unknown state"):
        inflight.snapshot(state="sleeping")


def test_a_retried_step_has_waited_since_this_attempt_not_since_its_old_decision():
    [run] = make_in_flight("acting", waited=300)
    claimed = timezone.now() - timedelta(seconds=2)
    Run.objects.filter(pk=run.pk).update(updated_at=claimed)  # claimed again after a backoff
    item = only(inflight.snapshot(), "acting")
    assert item.since == claimed and item.waited_s < 60


def test_it_reads_everything_in_two_queries_however_many_runs_are_in_flight(
    django_assert_num_queries,
):
    for state in ("deciding", "acting", "backoff", "approval", "in_doubt", "stalled", "queued"):
        make_in_flight(state, 15)
    with django_assert_num_queries(2):
        snap = inflight.snapshot()
    assert snap.total == 105
    with django_assert_num_queries(1):
        inflight.counts()


def test_a_worker_is_its_lease_owner_without_the_last_part():
    assert inflight.worker_of("web-3.example.com:4242:0badcafe") == "web-3.example.com:4242"
    assert inflight.worker_of("solo") == "solo"


def test_a_crashed_run_says_why_it_waits():
    [run] = make_in_flight("crashed")
    Run.objects.filter(pk=run.pk).update(error="step 3 crashed 5 times; last: Boom")
    item = only(inflight.snapshot(), "crashed")
    assert item.error == "step 3 crashed 5 times; last: Boom" and item.worker == ""
    [other] = make_in_flight("in_doubt")
    Run.objects.filter(pk=other.pk).update(error="not shown for other states")
    assert only(inflight.snapshot(state="in_doubt"), "in_doubt").error == ""
