"""The snapshot store returns exactly what was written, and stays small."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun import delta, snapshots
from agentrun.models import Run, Snapshot, SnapshotKind
from tests.agentrun.test_delta import json_values

pytestmark = pytest.mark.django_db

states = st.dictionaries(st.sampled_from(["a", "b", "notes", "log"]), json_values, max_size=4)


def write_chain(run, chain):
    """Store states as pre/post snapshots of consecutive steps, as the engine does."""
    prev = prev_state = prev_node = None
    for i, state in enumerate(chain):
        step, at = divmod(i + 2, 2)
        snap, node = snapshots.build(
            run.pk, step, ("pre", "post")[at], state, prev, prev_state, prev_node=prev_node
        )
        snap.save()
        prev, prev_state, prev_node = snap, state, node


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(states, min_size=1, max_size=8))
def test_reading_any_snapshot_returns_exactly_the_state_written(chain):
    run = Run.objects.create(agent="scripted")
    write_chain(run, chain)
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    for row, state in zip(rows, chain, strict=True):
        loaded = snapshots.load_state(Snapshot.objects.get(pk=row.pk))
        assert delta.canonical(loaded) == delta.canonical(state)
        assert row.hash == delta.state_hash(state)
    assert [delta.canonical(s) for _, s in snapshots.history(run.pk)] == [
        delta.canonical(s) for s in chain
    ]


def test_an_unchanged_state_is_stored_as_a_reference():
    run = Run.objects.create(agent="scripted")
    write_chain(run, [{"a": [1, 2]}, {"a": [1, 2]}])
    assert list(Snapshot.objects.filter(run=run).values_list("kind", flat=True)) == ["full", "ref"]


def test_appends_are_stored_as_small_deltas_with_keyframes_once_they_outweigh_the_state():
    run = Run.objects.create(agent="scripted")
    state = {"log": [], "n": 0}
    chain = []
    for i in range(60):
        state = {"log": [*state["log"], f"entry {i} " + "x" * 40], "n": i}
        chain.append(state)
    write_chain(run, chain)
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    kinds = [r.kind for r in rows]
    assert kinds[0] == SnapshotKind.FULL and kinds.count(SnapshotKind.FULL) >= 2
    for r in rows:
        assert (
            r.chain_bytes <= r.size
        )  # a read costs at most a keyframe plus a state's worth of deltas
        if r.kind == SnapshotKind.DELTA:
            assert r.stored_bytes < 200
    assert delta.canonical(snapshots.load_state(rows[-1])) == delta.canonical(chain[-1])


def test_a_state_with_a_lone_surrogate_is_stored_and_read_back_exactly():
    run = Run.objects.create(agent="scripted")
    base = "a long unchanged text " * 100  # so that changes are stored as deltas
    chain = [
        {"base": base, "log": ["ok"]},
        {"base": base, "log": ["ok", "half \ud800 a pair"]},
        {"base": base, "log": ["\udfff"], "k\ud800": 1},
    ]
    write_chain(run, chain)
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    assert [r.kind for r in rows] == ["full", "delta", "delta"]
    for row, state in zip(rows, chain, strict=True):
        assert snapshots.load_state(Snapshot.objects.get(pk=row.pk)) == state
        assert row.hash == delta.state_hash(state)
