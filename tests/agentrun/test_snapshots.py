"""The snapshot store returns exactly what was written, and stays small."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.models import Run, Snapshot, SnapshotKind
from agentrun.store import delta, snapshots
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


def test_a_state_mostly_rewritten_every_step_waits_longer_for_its_keyframes():
    """A window over the last entries: each step's delta replaces as much as it adds, so
    the deltas outweigh the state after a few steps. The keyframe then waits for
    KEYFRAME_ROWS rows or KEYFRAME_RATIO states' worth, whichever comes first."""
    run = Run.objects.create(agent="scripted")
    state: dict = {"window": [], "n": 0}
    chain = []
    for i in range(160):
        state = {"window": [*state["window"], f"entry {i} " + "y" * 60][-6:], "n": i}
        chain.append(state)
    write_chain(run, chain)
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    keyframes = [r.seq for r in rows if r.kind == SnapshotKind.FULL]
    assert keyframes[0] == rows[0].seq and len(keyframes) >= 2
    assert any(r.chain_bytes > r.size for r in rows)  # waited past one state's worth
    for r in rows:
        assert r.seq - r.keyframe_seq <= snapshots.KEYFRAME_ROWS
        assert r.chain_bytes <= r.size * snapshots.KEYFRAME_RATIO
    # One state's worth would have meant a keyframe every five rows or so.
    assert len(keyframes) <= len(rows) // 10
    for r in rows[::7] + rows[-1:]:
        assert delta.canonical(snapshots.load_state(r)) == delta.canonical(chain[rows.index(r)])


def test_deltas_packed_with_the_short_window_by_older_code_still_read_back():
    from django.db import connection

    from agentrun.store import codec

    run = Run.objects.create(agent="scripted")
    base = " ".join(f"word{j * 7919 % 1000}" for j in range(300))
    # Each step copies another stretch of the keyframe's text: a delta it packs well against.
    chain = [{"base": base, "echo": base[i * 40 : i * 40 + 300], "n": i} for i in range(12)]
    write_chain(run, chain)
    keyframe = Snapshot.objects.filter(run=run, kind=SnapshotKind.FULL).order_by("seq").first()
    text = codec.json_text(keyframe.data).encode()
    rewritten = 0
    for snap in Snapshot.objects.filter(
        run=run, kind=SnapshotKind.DELTA, keyframe_seq=keyframe.seq
    ):
        ops = codec.json_text(snap.data).encode()
        packed = codec.pack_text(ops, run.pk, keyframe.seq, text, codec.SHORT_WINDOW)
        if bytes(packed)[:1] == b"\x02":
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE agentrun_snapshot SET data = %s WHERE id = %s", [bytes(packed), snap.pk]
                )
            rewritten += 1
    assert rewritten >= 3
    codec.forget_dictionaries()
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    for row, state in zip(rows, chain, strict=True):
        assert delta.canonical(snapshots.load_state(row)) == delta.canonical(state)
    assert [delta.canonical(s) for _, s in snapshots.history(run.pk)] == [
        delta.canonical(s) for s in chain
    ]


def test_a_keyframe_read_before_is_not_taken_for_another_at_the_same_place():
    """A process keeps the keyframes it has read; a run deleted and written again under
    its id (an import) has another keyframe at the same seq, and that one is read."""
    run = Run.objects.create(agent="scripted")
    write_chain(run, [{"v": "first " * 50, "n": i} for i in range(4)])
    last = Snapshot.objects.filter(run=run).order_by("-seq").first()
    assert snapshots.load_state(last) == {"v": "first " * 50, "n": 3}
    assert snapshots.load_state(last) == {"v": "first " * 50, "n": 3}  # from the kept text
    Snapshot.objects.filter(run=run).delete()
    write_chain(run, [{"v": "second " * 50, "n": i} for i in range(4)])
    last = Snapshot.objects.filter(run=run).order_by("-seq").first()
    assert last.keyframe_seq == 2
    assert snapshots.load_state(last) == {"v": "second " * 50, "n": 3}


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
