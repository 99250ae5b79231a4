"""The snapshot store: deltas from the previous snapshot, adaptive keyframes.

Each run's snapshots form a chain ordered by `seq` (2*step for pre, 2*step+1
for post). A snapshot is stored as
- REF: the same state as the previous snapshot (a pre that equals the post
  before it), no data;
- DELTA: ops (agentrun.delta) turning the previous state into this one;
- FULL: the whole state, a keyframe, written whenever the delta bytes since
  the last keyframe would outweigh the state itself.
Reading any snapshot costs one keyframe plus at most a state's worth of
deltas; total storage stays within a small multiple of what changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrun import delta, hashing
from agentrun.models import Snapshot, SnapshotKind


@dataclass(frozen=True)
class Encoded:
    kind: str
    data: Any
    node: hashing.Node
    stored_bytes: int
    chain_bytes: int
    keyframe_seq: int


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def encode(
    state: dict[str, Any],
    seq: int,
    prev: Snapshot | None,
    prev_state: Any | None,
    prev_node: hashing.Node | None = None,
) -> Encoded:
    """Decide how to store `state` at position `seq` after `prev`.

    With the previous state's hash tree (`prev_node`), hash and size come from
    the delta alone; without it the whole state is hashed once.
    """
    if prev is None or prev_state is None:
        node = hashing.build(state)
        return Encoded(SnapshotKind.FULL, state, node, node.size, 0, seq)
    ops = delta.diff(prev_state, state)
    if not ops:
        node = prev_node or hashing.build(state)
        return Encoded(SnapshotKind.REF, None, node, 0, prev.chain_bytes, prev.keyframe_seq)
    node = hashing.apply(prev_node, ops) if prev_node is not None else hashing.build(state)
    ops_bytes = _json_bytes(ops)
    chain = prev.chain_bytes + ops_bytes
    if chain > node.size:
        return Encoded(SnapshotKind.FULL, state, node, node.size, 0, seq)
    return Encoded(SnapshotKind.DELTA, ops, node, ops_bytes, chain, prev.keyframe_seq)


def build(
    run_id: Any,
    step: int,
    at: str,
    state: dict[str, Any],
    prev: Snapshot | None,
    prev_state: Any | None,
    *,
    prev_node: hashing.Node | None = None,
    outcome: str = "",
) -> tuple[Snapshot, hashing.Node]:
    """An unsaved Snapshot of `state` (the caller saves it inside its commit) and its hash tree."""
    seq = Snapshot.seq_for(step, at)
    enc = encode(state, seq, prev, prev_state, prev_node)
    snapshot = Snapshot(
        run_id=run_id,
        step=step,
        at=at,
        seq=seq,
        kind=enc.kind,
        data=enc.data,
        keyframe_seq=enc.keyframe_seq,
        hash=enc.node.hex,
        size=enc.node.size,
        stored_bytes=enc.stored_bytes,
        chain_bytes=enc.chain_bytes,
        phase=str(state.get("phase", "")) if isinstance(state, dict) else "",
        outcome=outcome,
    )
    return snapshot, enc.node


def reference(run_id: Any, step: int, at: str, prev: Snapshot) -> Snapshot:
    """An unsaved REF snapshot: the same state as `prev`, stored as nothing."""
    return Snapshot(
        run_id=run_id,
        step=step,
        at=at,
        seq=Snapshot.seq_for(step, at),
        kind=SnapshotKind.REF,
        data=None,
        keyframe_seq=prev.keyframe_seq,
        hash=prev.hash,
        size=prev.size,
        stored_bytes=0,
        chain_bytes=prev.chain_bytes,
        phase=prev.phase,
        outcome="",
    )


def _replay(rows: list[Snapshot]) -> Any:
    state: Any = None
    for row in rows:
        if row.kind == SnapshotKind.FULL:
            state = row.data
        elif row.kind == SnapshotKind.DELTA:
            state = delta.patch(state, row.data)
    return state


def load_state(snapshot: Snapshot) -> dict[str, Any]:
    """The exact state stored at `snapshot`: its keyframe plus the deltas after it."""
    if snapshot.kind == SnapshotKind.FULL:
        return snapshot.data
    rows = list(
        Snapshot.objects.filter(
            run_id=snapshot.run_id, seq__gte=snapshot.keyframe_seq, seq__lte=snapshot.seq
        ).order_by("seq")
    )
    return _replay(rows)


def get(run_id: Any, step: int, at: str) -> Snapshot:
    return Snapshot.objects.get(run_id=run_id, seq=Snapshot.seq_for(step, at))


def load(run_id: Any, step: int, at: str) -> dict[str, Any]:
    return load_state(get(run_id, step, at))


def history(run_id: Any) -> list[tuple[Snapshot, dict[str, Any]]]:
    """Every snapshot of a run with its state, in order, in one pass."""
    rows = list(Snapshot.objects.filter(run_id=run_id).order_by("seq"))
    out: list[tuple[Snapshot, dict[str, Any]]] = []
    state: Any = None
    for row in rows:
        if row.kind == SnapshotKind.FULL:
            state = row.data
        elif row.kind == SnapshotKind.DELTA:
            state = delta.patch(state, row.data)
        out.append((row, state))
    return out
