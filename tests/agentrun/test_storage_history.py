"""A run's whole history in one pass: the same states as reading each snapshot alone."""

import gc
import json

import pytest

from agentrun.models import Run, Snapshot
from agentrun.store import snapshots
from tests.agentrun.test_snapshots import write_chain

pytestmark = pytest.mark.django_db


def exact(value):
    return json.dumps(value)


def growing_chain(n):
    """Appends and in-place edits, long enough for several keyframes and references."""
    state = {"log": [], "notes": {}, "n": 0.0}
    chain = []
    for i in range(n):
        if i % 3 == 2:
            chain.append(state)  # unchanged: stored as a reference
            continue
        state = {
            "log": [*state["log"], {"i": i, "text": f"entry {i} " + "words " * 8}],
            "notes": {**state["notes"], f"k{i % 4}": [i, -0.0, 1e16, "é𝄞"]},
            "n": state["n"] + 0.5,
        }
        chain.append(state)
    return chain


def test_history_gives_every_snapshot_with_exactly_the_state_load_state_gives():
    run = Run.objects.create(agent="scripted")
    chain = growing_chain(40)
    write_chain(run, chain)
    rows = list(Snapshot.objects.filter(run=run).order_by("seq"))
    assert {r.kind for r in rows} == {"full", "delta", "ref"}
    history = snapshots.history(run.pk)
    assert len(history) == len(rows) == len(chain)
    for (snap, state), row, written in zip(history, rows, chain, strict=True):
        assert exact(state) == exact(snapshots.load_state(row)) == exact(written)
        for field in Snapshot._meta.concrete_fields:
            assert getattr(snap, field.attname) == getattr(row, field.attname), field.name
        assert not snap._state.adding


def test_history_of_an_empty_run_is_empty():
    assert snapshots.history(Run.objects.create(agent="scripted").pk) == []


def test_history_leaves_the_garbage_collector_as_it_found_it():
    run = Run.objects.create(agent="scripted")
    write_chain(run, growing_chain(6))
    assert gc.isenabled()
    snapshots.history(run.pk)
    assert gc.isenabled()
    gc.disable()
    try:
        snapshots.history(run.pk)
        assert not gc.isenabled()
    finally:
        gc.enable()
