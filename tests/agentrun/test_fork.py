"""Forking a run from any snapshot, in each replay mode, never touching the parent."""

import pytest

from agentrun.lifecycle.services import ForkError, fork_run
from agentrun.models import (
    Event,
    LedgerEntry,
    LedgerInvocation,
    Reservation,
    Run,
    Snapshot,
    Step,
    ToolCall,
)
from agentrun.store import snapshots
from agentrun.store.delta import state_hash
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

SIDE_EFFECTS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    calls({"tool": "notify", "args": {"to": "ana", "body": "booked"}}),
    final("booked"),
)


@pytest.fixture
def olga():
    return make_people()["operator"]


def parent_hashes(run):
    return list(Snapshot.objects.filter(run=run).order_by("seq").values_list("hash", flat=True))


def counts():
    return (
        LedgerEntry.objects.count(),
        sum(LedgerInvocation.objects.values_list("count", flat=True)),
        Reservation.objects.count(),
        ToolCall.objects.filter(kind="write", status="ok").count(),
    )


def test_a_fork_from_a_pre_snapshot_starts_at_that_step_with_that_state(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    before = parent_hashes(parent)
    fork = fork_run(parent, step=2, at="pre", user=olga, reason="look again")
    assert (fork.parent_id, fork.first_step, fork.next_step, fork.mode) == (
        parent.pk,
        2,
        2,
        "sandbox",
    )
    assert fork.forked_from == snapshots.get(parent.pk, 2, "pre")
    assert snapshots.get(fork.pk, 2, "pre").hash == snapshots.get(parent.pk, 2, "pre").hash
    drive(fork)
    assert fork.status == "succeeded"
    assert sorted(fork.steps.values_list("number", flat=True)) == [2, 3, 4]
    assert parent_hashes(parent) == before
    event = Event.objects.get(run=fork, kind="run_forked")
    assert (event.actor, event.reason, event.payload["step"]) == ("olga", "look again", 2)


def test_a_fork_from_a_post_snapshot_starts_at_the_next_step(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    fork = fork_run(parent, step=1, at="post", user=olga)
    assert fork.first_step == 2
    assert snapshots.get(fork.pk, 2, "pre").hash == snapshots.get(parent.pk, 1, "post").hash


def test_sandbox_never_invokes_a_write_or_hybrid_tool(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    before = counts()
    fork = drive(fork_run(parent, step=1, at="pre", user=olga))
    assert fork.status == "succeeded"
    assert counts() == before
    skipped = ToolCall.objects.filter(run=fork, kind__in=("write", "hybrid"))
    assert {tc.status for tc in skipped} == {"skipped"}
    # The parent's recorded result stands in for the call that was not made.
    ledger = skipped.get(tool="ledger_write")
    assert ledger.result == ToolCall.objects.get(run=parent, tool="ledger_write").result


def test_live_mode_needs_confirmation_and_uses_fresh_idempotency_keys(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    with pytest.raises(ForkError, match="confirm"):
        fork_run(parent, step=2, at="pre", mode="live", user=olga)
    fork = drive(fork_run(parent, step=2, at="pre", mode="live", user=olga, confirm_live=True))
    assert fork.status == "succeeded"
    parent_keys = set(ToolCall.objects.filter(run=parent).values_list("idempotency_key", flat=True))
    fork_keys = set(ToolCall.objects.filter(run=fork).values_list("idempotency_key", flat=True))
    assert fork_keys and not parent_keys & fork_keys
    assert LedgerEntry.objects.filter(run=fork).count() == 1
    assert LedgerEntry.objects.filter(run=parent).count() == 1


def test_recorded_mode_replays_identically_without_calling_anything(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    before = counts()
    fork = drive(fork_run(parent, step=1, at="pre", mode="recorded", user=olga))
    assert fork.status == "succeeded" and fork.divergence_step is None
    assert snapshots.get(fork.pk, 4, "post").hash == snapshots.get(parent.pk, 4, "post").hash
    assert counts() == before
    assert set(Step.objects.filter(run=fork).values_list("decision_count", flat=True)) == {0}
    assert {tc.status for tc in ToolCall.objects.filter(run=fork)} == {"replayed"}


def test_recorded_mode_marks_the_first_divergent_step(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    state = snapshots.load(parent.pk, 3, "pre")
    state["memory"]["notes"]["operator"] = "changed my mind"
    fork = drive(fork_run(parent, step=3, at="pre", mode="recorded", state=state, user=olga))
    assert fork.divergence_step == 3
    assert Event.objects.filter(run=fork, kind="diverged", step=3).exists()
    # After the divergence it goes on in sandbox mode: notify is skipped, not sent twice.
    assert ToolCall.objects.get(run=fork, tool="notify").status == "skipped"


def test_an_edited_state_is_recorded_with_its_diff(olga):
    parent = drive(make_run(SIDE_EFFECTS))
    state = snapshots.load(parent.pk, 2, "pre")
    state["memory"]["goal"] = "a different goal"
    fork = fork_run(parent, step=2, at="pre", state=state, user=olga, reason="fix the goal")
    assert snapshots.get(fork.pk, 2, "pre").hash == state_hash(state)
    edits = Event.objects.get(run=fork, kind="run_forked").payload["edits"]
    assert edits == [["set", ["memory", "goal"], "a different goal"]]


def test_a_fork_of_a_running_parent_and_a_fork_of_a_fork(olga):
    parent = make_run(
        script(
            calls({"tool": "echo", "args": {"n": 1}}),
            calls(
                {"tool": "ledger_write", "args": {"account": "a", "amount": 1}, "approval": True}
            ),
            final("x"),
        )
    )
    drive(parent)
    assert parent.status == "waiting"
    fork = drive(fork_run(parent, step=1, at="post", user=olga))
    assert fork.status == "succeeded"
    grandchild = drive(fork_run(fork, step=2, at="pre", mode="recorded", user=olga))
    assert grandchild.status == "succeeded" and grandchild.divergence_step is None
    assert grandchild.lineage() == [parent, fork, grandchild]
    assert Run.objects.get(pk=parent.pk).status == "waiting"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": 9}, "no pre snapshot of step 9"),
        ({"step": "2"}, "step must be an integer"),
        ({"step": 2, "at": "middle"}, 'at must be "pre" or "post"'),
        ({"step": 2, "mode": "yolo"}, "mode must be one of"),
        ({"step": 2, "state": {"phase": "bogus"}}, "state: phase"),
        ({"step": 2, "state": {"phase": "planning", "memory": {"notes": []}}}, "memory.notes"),
        ({"step": 2, "state": []}, "state"),
        ({"step": 4, "at": "post"}, "nothing would run"),
    ],
)
def test_an_invalid_fork_request_gets_a_clear_error_and_creates_nothing(olga, kwargs, message):
    parent = drive(make_run(SIDE_EFFECTS))
    runs, events = Run.objects.count(), Event.objects.count()
    with pytest.raises(ForkError, match=message):
        fork_run(parent, user=olga, **kwargs)
    assert (Run.objects.count(), Event.objects.count()) == (runs, events)
