"""Reading snapshot states for display: several at once, in one pass over the chain.

`agentrun.store.snapshots.load_state` reads one snapshot as model rows; a diff needs two
states that usually share a keyframe (pre and post of a step), and a 1,000-step run
has hundreds of deltas after each keyframe. Reading (seq, kind, data) tuples once
and replaying them yields both states, and consecutive states share every
untouched subtree, which makes the structural diff between them nearly free.

The replay owns what it has just parsed, so it applies the deltas in place
(`delta.patch` copies every container on an op's path, which for a growing
list is most of the cost) until it hands a state out; from then on it copies
a container once before changing it, as `delta.patch` does. The pre → post
diff of a step is therefore one load of the pre state plus the post's ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrun.models import Snapshot, SnapshotKind
from agentrun.store import delta, snapshots
from debugger.diffs import StateDiff, diff_states


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


def diff_snapshots(a: Snapshot, b: Snapshot) -> StateDiff:
    """What the debugger shows as the diff from snapshot a to snapshot b.

    The one function behind every snapshot diff page (and the benchmark's diff
    figures). For the pre and post of one step the chain is read once, up to the
    pre, and the post is the pre with the post's delta applied.
    """
    if a.hash == b.hash:  # same content: nothing to load
        return diff_states({}, {}, a.size, b.size)
    old, new = load_states([a, b])
    return diff_states(old, new, a.size, b.size)


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
    rows = snapshots.chain(run_id, group[0].keyframe_seq, group[-1].seq, refs=True)
    if not rows or rows[0][1] in _RELATIVE:  # not a chain from a keyframe: the store's reader
        return {s.pk: snapshots.load_state(s) for s in group}
    out: dict[int, Any] = {}
    replay = _Replay()
    for seq, kind, data in rows:
        if kind == SnapshotKind.FULL:
            replay.reset(data)
        elif kind == SnapshotKind.DELTA:
            replay.apply(data)
        elif kind != SnapshotKind.REF:
            # A state the store resolves elsewhere (a fork's first snapshot refers to
            # its source in the parent run): read it as the store does, never change it.
            source = Snapshot.objects.defer("data").get(run_id=run_id, seq=seq)
            replay.reset(snapshots.load_state(source), owned=False)
        if seq in targets:
            out[targets[seq]] = replay.hand_out()
    return out


_RELATIVE = frozenset({SnapshotKind.DELTA, SnapshotKind.REF})


class _Replay:
    """A state being rebuilt from parsed rows, changed in place where nobody else sees it.

    `owned` holds the ids of the containers only this replay references; None
    means all of them (a freshly parsed keyframe and deltas share nothing with
    anyone). Handing the state out empties it: from then on each container is
    copied the first time an op changes it, and the copy is owned.
    """

    def __init__(self) -> None:
        self.root: list[Any] = [None]
        self.owned: set[int] | None = None
        self.keep: list[Any] = []  # owned copies stay alive, so their ids stay unique

    def reset(self, state: Any, owned: bool = True) -> None:
        self.root, self.owned, self.keep = [state], (None if owned else set()), []

    def hand_out(self) -> Any:
        self.owned, self.keep = set(), []
        return self.root[0]

    def apply(self, ops: list) -> None:
        try:
            for op in ops:
                self._apply(op)
        except (LookupError, TypeError, ValueError) as exc:
            raise delta.DeltaError(f"a stored delta does not fit its chain: {exc}") from exc

    def _apply(self, op: list) -> None:
        name, path = op[0], op[1]
        if name == "splice":
            node = self._walk(path)
            start, dropped, items = op[2], op[3], op[4]
            if not 0 <= start <= start + dropped <= len(node):
                raise ValueError(f"splice out of range: {op[:4]!r}")
            node[start : start + dropped] = items
        elif not path:
            if name != "set":
                raise ValueError(f"bad op at the root: {op[:2]!r}")
            self.root[0] = op[2]
        elif name == "set":
            node = self._walk(path[:-1])
            if isinstance(node, list) and not 0 <= path[-1] < len(node):
                raise ValueError(f"set out of range: {op[:2]!r}")
            node[path[-1]] = op[2]
        elif name == "del":
            node = self._walk(path[:-1])
            if not isinstance(node, dict):
                raise ValueError(f"del in a list: {op[:2]!r}")
            del node[path[-1]]
        else:
            raise ValueError(f"unknown op {name!r}")

    def _walk(self, path: list) -> Any:
        if self.owned is None:  # the common case, hundreds of times per read
            node = self.root[0]
            for key in path:
                node = node[key]
            return node
        node = self._own(self.root, 0)
        for key in path:
            node = self._own(node, key)
        return node

    def _own(self, parent: Any, key: Any) -> Any:
        child = parent[key]
        if self.owned is None or id(child) in self.owned:
            return child
        if isinstance(child, dict):
            child = dict(child)
        elif isinstance(child, list):
            child = list(child)
        else:
            raise TypeError(f"the path goes through a {type(child).__name__}")
        self.owned.add(id(child))
        self.keep.append(child)
        parent[key] = child
        return child
