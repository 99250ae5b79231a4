"""The diff pages' one-pass diff equals diffing two separately loaded states."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from agentrun.models import Snapshot, SnapshotKind
from agentrun.store import snapshots
from agentrun.store.delta import state_hash
from debugger.diffs import diff_states
from debugger.states import diff_snapshots, load_states
from tests.base import calls, drive, make_run, script
from tests.debugger import runs

pytestmark = pytest.mark.django_db


def two_loads(a: Snapshot, b: Snapshot):
    return diff_states(snapshots.load_state(a), snapshots.load_state(b), a.size, b.size)


def assert_same_diff(a: Snapshot, b: Snapshot) -> None:
    got, want = diff_snapshots(a, b), two_loads(a, b)
    assert got.changes == want.changes
    assert (got.summary, got.old_size, got.new_size) == (want.summary, want.old_size, want.new_size)


def step_pairs(run):
    snaps = {(s.step, s.at): s for s in Snapshot.objects.filter(run=run)}
    return [(snaps[n, "pre"], snaps[n, "post"]) for n, at in sorted(snaps) if at == "pre"]


def growing_run(steps: int = 40):
    """Each step appends a longer note: keyframes fall at several steps."""
    return drive(
        make_run(
            script(
                *(
                    calls({"tool": "echo", "args": {"note": f"{i} " + "words " * (i * 7)}})
                    for i in range(steps)
                )
            )
        ),
        max_steps=steps + 5,
    )


def test_every_step_diff_of_a_long_run_equals_the_two_load_diff(people):
    run = growing_run()
    pairs = step_pairs(run)
    kinds = {(pre.kind, post.kind) for pre, post in pairs}
    assert (SnapshotKind.REF, SnapshotKind.FULL) in kinds  # keyframe steps
    assert (SnapshotKind.REF, SnapshotKind.DELTA) in kinds
    for pre, post in pairs:
        assert_same_diff(pre, post)


def test_a_failed_steps_diff_equals_the_two_load_diff(people):
    run = runs.failing_run(people["operator"])
    pre, post = step_pairs(run)[-1]
    assert post.outcome == "failed"
    assert_same_diff(pre, post)
    assert not diff_snapshots(pre, post).identical


def test_a_forks_first_steps_diff_equals_the_two_load_diff(people):
    parent = runs.walkthrough_run(people["operator"])
    state = snapshots.load(parent.pk, 4, "pre")
    edited = {**state, "memory": {**state["memory"], "goal": "Refund order 1043 instead"}}
    for fork in (
        services.fork_run(parent, step=4, at="pre", user=people["operator"], reason="as is"),
        services.fork_run(parent, step=4, at="post", user=people["operator"], reason="as is"),
        services.fork_run(parent, step=4, state=edited, user=people["operator"], reason="edit"),
    ):
        fork = drive(fork)
        first = Snapshot.objects.filter(run=fork).order_by("seq").first()
        assert first.kind == SnapshotKind.FORK  # its state is read from the parent run
        for pre, post in step_pairs(fork):
            assert_same_diff(pre, post)
        assert_same_diff(snapshots.get(parent.pk, 4, "pre"), first)
        assert_same_diff(first, snapshots.get(parent.pk, 8, "post"))


def test_any_two_snapshots_of_one_or_two_runs_diff_as_two_loads(people):
    run = growing_run(30)
    other = runs.walkthrough_run(people["operator"])
    snaps = list(Snapshot.objects.filter(run=run).order_by("seq"))
    for a, b in [(snaps[3], snaps[40]), (snaps[50], snaps[7]), (snaps[1], snaps[-1])]:
        assert_same_diff(a, b)
    assert_same_diff(snaps[20], snapshots.get(other.pk, 3, "post"))


def test_states_handed_out_are_never_changed_by_a_later_replay(people):
    run = growing_run(30)
    snaps = list(Snapshot.objects.filter(run=run).order_by("seq"))
    picked = [snaps[i] for i in (2, 9, 10, 11, 25, len(snaps) - 1)]
    states = load_states(picked)
    for snap, state in zip(picked, states, strict=True):
        assert state_hash(state) == snap.hash
