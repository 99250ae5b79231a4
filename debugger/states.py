"""Reading snapshot states for display: several at once, in one pass over the chain.

`agentrun.snapshots.load_state` reads one snapshot as model rows; a diff needs two
states that usually share a keyframe (pre and post of a step), and a 1,000-step run
has hundreds of deltas after each keyframe. Reading (seq, kind, data) tuples once
and replaying them yields both states, and consecutive states share every
untouched subtree, which makes the structural diff between them nearly free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from agentrun import delta
from agentrun.models import Snapshot, SnapshotKind


def load_states(snaps: Sequence[Snapshot]) -> list[Any]:
    """The states of `snaps` (any runs, any order), in the same order."""
    states: dict[int, Any] = {}
    by_run: dict[Any, list[Snapshot]] = {}
    for snap in snaps:
        if snap.kind == SnapshotKind.FULL and snap.data is not None:
            states[snap.pk] = snap.data
        else:
            by_run.setdefault(snap.run_id, []).append(snap)
    for run_id, wanted in by_run.items():
        for group in _passes(sorted(wanted, key=lambda s: s.seq)):
            states.update(_replay(run_id, group))
    return [states[s.pk] for s in snaps]


def _passes(wanted: list[Snapshot]) -> list[list[Snapshot]]:
    """Targets that one replay can serve: each starts before the previous target's end."""
    groups: list[list[Snapshot]] = []
    for snap in wanted:
        if groups and snap.keyframe_seq <= groups[-1][-1].seq:
            groups[-1].append(snap)
        else:
            groups.append([snap])
    return groups


def _replay(run_id: Any, group: list[Snapshot]) -> dict[int, Any]:
    targets = {s.seq: s.pk for s in group}
    rows = (
        Snapshot.objects.filter(
            run_id=run_id, seq__gte=group[0].keyframe_seq, seq__lte=group[-1].seq
        )
        .order_by("seq")
        .values_list("seq", "kind", "data")
    )
    out: dict[int, Any] = {}
    state: Any = None
    for seq, kind, data in rows.iterator(chunk_size=200):
        if kind == SnapshotKind.FULL:
            state = data
        elif kind == SnapshotKind.DELTA:
            state = delta.patch(state, cast(list, data))
        if seq in targets:
            out[targets[seq]] = state
    return out
