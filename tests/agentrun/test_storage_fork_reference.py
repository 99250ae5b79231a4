"""A fork's first snapshot refers to its source in the parent run instead of copying it."""

import json

import pytest

from agentrun.lifecycle.services import fork_run
from agentrun.models import Snapshot, SnapshotKind
from agentrun.store import delta, snapshots
from agentrun.store.delta import state_hash
from debugger.states import load_states
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

STEPS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls({"tool": "echo", "args": {"n": 2}}),
    calls({"tool": "echo", "args": {"n": 3}}),
    final("done"),
)


def exact(value):
    return json.dumps(value)


def parent_rows(run):
    return list(
        Snapshot.objects.filter(run=run)
        .order_by("seq")
        .values_list("seq", "kind", "data", "hash", "keyframe_seq", "chain_bytes")
    )


def assert_every_state_is_exact(run):
    """load_state, history and the debugger's reader agree; each state hashes to its hash."""
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    history = snapshots.history(run.pk)
    many = load_states(rows)
    assert [s.pk for s, _ in history] == [r.pk for r in rows]
    for row, (_, from_history), from_many in zip(rows, history, many, strict=True):
        state = snapshots.load_state(row)
        assert state_hash(state) == row.hash
        assert exact(from_history) == exact(state) == exact(from_many)


@pytest.fixture
def olga():
    return make_people()["operator"]


@pytest.fixture
def parent():
    return drive(make_run(STEPS))


@pytest.fixture
def long_parent():
    return drive(
        make_run(script(*[calls({"tool": "echo", "args": {"n": i}}) for i in range(12)], final()))
    )


def test_an_unedited_fork_stores_a_reference_with_no_data_and_the_source_state(olga, parent):
    before = parent_rows(parent)
    source = snapshots.get(parent.pk, 2, "post")
    fork = fork_run(parent, step=2, at="post", user=olga)
    first = snapshots.get(fork.pk, 3, "pre")
    assert (first.kind, first.data, first.stored_bytes) == (SnapshotKind.FORK, None, 0)
    assert (first.hash, first.size) == (source.hash, source.size)
    assert first.chain_bytes == source.chain_bytes + source.size // snapshots.FORK_HOP_SHARE
    assert exact(snapshots.load_state(first)) == exact(snapshots.load_state(source))
    drive(fork)
    assert fork.status == "succeeded"
    assert parent_rows(parent) == before
    assert_every_state_is_exact(fork)
    assert_every_state_is_exact(parent)


def test_an_edited_fork_stores_only_the_edit(olga, parent):
    before = parent_rows(parent)
    source_state = snapshots.load(parent.pk, 2, "pre")
    state = snapshots.load(parent.pk, 2, "pre")
    state["memory"]["notes"]["operator"] = "try the other way"
    fork = fork_run(parent, step=2, at="pre", state=state, user=olga)
    first = snapshots.get(fork.pk, 2, "pre")
    assert first.kind == SnapshotKind.FORK
    assert first.data == delta.diff(source_state, state)
    assert "try the other way" in json.dumps(first.data) and first.stored_bytes < 200
    assert exact(snapshots.load_state(first)) == exact(state)
    assert first.hash == state_hash(state)
    drive(fork)
    assert fork.status == "succeeded"
    assert parent_rows(parent) == before
    assert_every_state_is_exact(fork)


def test_an_edit_that_leaves_less_than_the_chain_it_would_replay_is_a_keyframe(olga, long_parent):
    source = snapshots.get(long_parent.pk, 10, "post")
    state = snapshots.load_state(source)
    state["history"], state["tool_calls"], state["decisions"] = state["history"][:1], [], []
    fork = fork_run(long_parent, step=10, at="post", state=state, user=olga)
    first = snapshots.get(fork.pk, 11, "pre")
    assert first.size < source.chain_bytes
    assert (first.kind, first.chain_bytes) == (SnapshotKind.FULL, 0)
    assert exact(snapshots.load_state(first)) == exact(state)
    assert_every_state_is_exact(drive(fork))


def test_forks_of_forks_read_through_every_generation(olga, parent):
    child = drive(fork_run(parent, step=1, at="post", user=olga))
    # From the child's own first snapshot (a reference to a reference) and from a later one.
    state = snapshots.load(child.pk, 2, "pre")
    state["memory"]["notes"]["grandchild"] = "edited"
    grandchild = drive(fork_run(child, step=2, at="pre", state=state, user=olga))
    great = drive(fork_run(grandchild, step=3, at="post", user=olga))
    for run in (parent, child, grandchild, great):
        assert run.status == "succeeded"
        assert_every_state_is_exact(run)
    assert exact(snapshots.load(grandchild.pk, 2, "pre")) == exact(state)
    assert snapshots.get(great.pk, 4, "pre").hash == snapshots.get(grandchild.pk, 3, "post").hash
    # A fork's chain includes its source's, so the keyframe rule still bounds every read.
    for snap in Snapshot.objects.filter(run__in=(child, grandchild, great)):
        assert snap.chain_bytes <= snap.size


def test_a_fork_keeps_the_chain_it_inherits_within_the_keyframe_rule(olga, long_parent):
    source = snapshots.get(long_parent.pk, 8, "post")
    assert source.kind == SnapshotKind.DELTA and source.chain_bytes > source.size / 2
    fork = drive(fork_run(long_parent, step=8, at="post", user=olga))
    rows = list(Snapshot.objects.filter(run=fork).order_by("seq"))
    assert rows[0].kind == SnapshotKind.FORK and rows[0].chain_bytes > source.chain_bytes
    # The inherited chain brings the fork's first keyframe forward.
    assert SnapshotKind.FULL in [r.kind for r in rows[:6]]
    for snap in rows:
        assert snap.chain_bytes <= snap.size
    assert_every_state_is_exact(fork)


def test_forks_of_forks_at_their_first_snapshot_meet_a_keyframe_within_a_few_runs(olga):
    run = drive(make_run(STEPS))
    kinds = []
    for _ in range(20):
        run = fork_run(run, step=2, at="pre", user=olga)
        kinds.append(snapshots.get(run.pk, 2, "pre").kind)
    assert SnapshotKind.FULL in kinds[: snapshots.FORK_HOP_SHARE + 1]
    since_keyframe = kinds[::-1].index(SnapshotKind.FULL)
    assert since_keyframe <= snapshots.FORK_HOP_SHARE
    assert_every_state_is_exact(drive(run))
