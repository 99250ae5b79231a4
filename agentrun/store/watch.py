"""Watch one value of a run's state: every step that changed it, with before and after.

An incident often starts with one value ("when did the agent's copy of the cart
change?"). Snapshots are stored as deltas, so the steps that changed a path are
found by reading deltas, not by rebuilding every state:

- each snapshot records the paths its change touched (`touched_paths`, in
  `Snapshot.paths`, cut to `INDEX_DEPTH` keys), so the database hands back only the
  snapshots that may have changed the watched path (REF snapshots never do);
- of those, only the ops that can reach the path are applied, to a working copy
  that is right along the path (and may be stale elsewhere);
- a fork's history goes on into its parent before the fork point (inherited).

Paths: a JSON pointer (`/memory/notes/cart`) or a dotted path (`memory.notes.cart`,
`messages.3.content`, `messages[3]`, `notes["a b"]`). A number is a list index, or
the key with those digits in an object.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from copy import copy
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

from django.db.models import BinaryField, ExpressionWrapper, F, Q

from agentrun.models import Run, Snapshot, SnapshotKind, Step, ToolCall
from agentrun.store import delta, rawsql, snapshots
from agentrun.store.codec import inflate_many
from agentrun.store.paths import (
    _MARK,
    _SPLICE_DIGITS,
    INDEX_DEPTH,
    MAX_PATH_CHARS,
    MISSING,
    Path,
    PathSyntaxError,
    _digits,
    _line,
    _token,
    format_path,
    may_change_whole,
    named_paths,
    parse_path,
    pointer,
    resolve,
    touched_paths,
)

__all__ = [
    "COUNTED",
    "MAX_PATH_CHARS",
    "MISSING",
    "Change",
    "History",
    "PathSyntaxError",
    "format_path",
    "history",
    "named_paths",
    "parse_path",
    "pointer",
    "touched_paths",
    "value_now",
]

#: A paged history is scanned for at least this many changes: up to it, it is counted whole.
COUNTED = 200
#: Forks of forks followed into their parents at most (a fork's read crosses at most 16).
MAX_HOPS = 32


@dataclass(frozen=True)
class _Front:
    """The first list on a watched path that goes on to its item `index` (≥ 0), only keys
    leading to it. Splices of it that start after that item are not read (the index
    leaves them out), so the working state holds that list up to the item only."""

    keys: list[str]
    index: int


def _front(path: Path) -> _Front | None:
    for k, p in enumerate(path):
        if type(p) is int:
            return _Front(list(path[:k]), p) if p >= 0 and k < INDEX_DEPTH else None
    return None


def _index_lines(path: Path) -> tuple[set[str], tuple[str, ...]]:
    """The lines of Snapshot.paths that may reach `path`: those equal to one of the first
    set, and those that start with one of the second."""
    norm = path[:INDEX_DEPTH]
    front = _front(path)
    exact: set[str] = set()
    starts: list[str] = []
    for k in range(len(norm) + 1):
        line = _line(norm[:k])
        exact.add(line)
        if k >= INDEX_DEPTH:
            continue
        if front is not None and k == len(front.keys):
            # Splices whose start has at most as many digits as the item's index.
            exact.update(
                line + "~" + letter for letter in _SPLICE_DIGITS[: _digits(front.index) + 1]
            )
        else:
            starts.append(line + "~")
    if len(path) < INDEX_DEPTH:
        starts.append(_line(norm) + "/")
    return exact, tuple(starts)


def _may_touch(path: Path) -> Q:
    """Snapshots whose recorded paths may reach `path` (or that recorded none: "")."""
    exact, starts = _index_lines(path)
    q = Q(paths="")
    for line in sorted(exact):
        q |= Q(paths__contains="\n" + line + "\n")
    for start in starts:
        q |= Q(paths__contains="\n" + start)
    return q


def _reaches(op_path: Sequence[Any], path: Path) -> bool:
    """Whether an op at op_path can change the value at path, now or once lists shift.

    An op on another item of a list on the way is applied too: a later splice can
    move that item to the watched index.
    """
    for q, p in zip(op_path, path, strict=False):
        if type(p) is int:
            if type(q) is int:
                continue
            if q != str(p):
                return False
        elif q != p:
            return False
    return True


def _reaching(ops: list, path: Path) -> list:
    """The ops that reach `path` (`_reaches`). Most ops of a delta are under another key
    of the state: those are passed over on their first key, without a call each (a
    negative index or a whole history reads every delta of a run)."""
    if not path or type(path[0]) is not str:
        return [op for op in ops if _reaches(op[1], path)]
    first = path[0]
    return [op for op in ops if (not op[1] or op[1][0] == first) and _reaches(op[1], path)]


def _relation(op: list, path: Path) -> str:
    """How an op reaching path touched it: set, del, ancestor-splice, ancestor, inside, sibling."""
    op_path = op[1]
    for q, p in zip(op_path, path, strict=False):
        if type(q) is int and type(p) is int and q != p:
            return "sibling"
    if op[0] == "splice":
        return "splice" if len(op_path) < len(path) else "inside"
    if len(op_path) == len(path):
        return op[0]
    return "ancestor" if len(op_path) < len(path) else "inside"


def same(a: Any, b: Any) -> bool:
    """Whether two values at a path are the same (JSON types included; MISSING too)."""
    if a is MISSING or b is MISSING:
        return a is b
    return delta._eq(a, b)


# --- the history -----------------------------------------------------------------------


@dataclass
class Change:
    """One snapshot at which the watched value differs from the snapshot before it."""

    run_id: Any
    step: int
    at: str  # "post": the step's own change; "pre": an edit before the step (a fork)
    seq: int
    kind: str  # added | removed | set | moved
    how: str  # what touched it, in words
    before: Any
    after: Any
    inherited: bool = False  # a parent's change, before the fork point

    @property
    def before_exists(self) -> bool:
        return self.before is not MISSING

    @property
    def after_exists(self) -> bool:
        return self.after is not MISSING


@dataclass
class Start:
    """Where the watched history begins: the first snapshot of the oldest run in the chain."""

    run_id: Any
    step: int
    at: str
    value: Any

    @property
    def exists(self) -> bool:
        return self.value is not MISSING


@dataclass
class History:
    run: Run
    path: Path
    start: Start
    changes: list[Change] = field(default_factory=list)
    current: Any = MISSING
    snapshots_read: int = 0  # snapshots whose data was read (deltas and keyframes)
    more: bool = False  # stopped after `limit` changes: there are more after them

    @property
    def display(self) -> str:
        return format_path(self.path)

    @property
    def ever_existed(self) -> bool:
        return self.start.exists or any(c.after_exists or c.before_exists for c in self.changes)

    @property
    def exists_now(self) -> bool:
        return self.current is not MISSING

    def own(self) -> list[Change]:
        return [c for c in self.changes if not c.inherited]

    def around(self, step: int) -> tuple[Change | None, Change | None, Change | None]:
        """(the last change before step, the change at step, the first change after it)."""
        before = at = after = None
        for c in self.changes:
            if c.step < step:
                before = c
            elif c.step == step and at is None and not c.inherited:
                at = c
            elif c.step > step and after is None and not c.inherited:
                after = c
        return before, at, after


def history(
    run: Run,
    path: Path,
    upto: tuple[int, str] | None = None,
    *,
    limit: int | None = None,
    past_step: int | None = None,
) -> History:
    """Every change of the value at `path` in `run` (and, for a fork, in its parents
    before the fork point), oldest first. `upto`: stop at that (step, at) snapshot.

    `limit`: only the first `limit` changes; the scan stops at the next one (`more`),
    so a value that every step changes costs its first changes, not the whole run
    (the value now is then read on its own, see `value_now`). With `past_step` too,
    the scan goes on to the run's first change after that step (`around` needs it)."""

    upto_seq = Snapshot.seq_for(*upto) if upto else None
    scan = _Scan(path, limit, past_step)
    with snapshots.gc_paused():  # the deltas decoded and the working state: none of it is garbage
        try:
            state, _ = scan.run(run, upto_seq, hops=0)
            current = resolve(state, path)
        except _Enough:
            if past_step is None:
                del scan.changes[limit:]
            current = value_now(run, path, upto_seq, scan)
    assert scan.start is not None
    return History(
        run=run,
        path=path,
        start=scan.start,
        changes=scan.changes,
        current=current,
        snapshots_read=scan.read,
        more=scan.stopped,
    )


_FIELDS = ("seq", "step", "at", "kind", "data", "paths")


class _Enough(Exception):
    """The scan found the changes it was asked for, and one more."""


class _Scan:
    def __init__(self, path: Path, limit: int | None = None, past_step: int | None = None) -> None:
        self.path = path
        self.limit = limit
        self.past_step = past_step
        self.past = past_step is None  # a change of this run after past_step was found
        self.changes: list[Change] = []
        self.read = 0
        self.start: Start | None = None
        self.stopped = False
        self.work = _Working(path, self)

    def run(self, run: Run, upto_seq: int | None, hops: int) -> tuple[Any, Start]:
        """Scan `run` up to upto_seq; return the working state there and the start."""
        inherited = hops > 0
        work = self.work  # one for the whole chain: a parent's list may reach a fork trimmed
        first = Snapshot.objects.filter(run_id=run.pk).order_by("seq").values_list(*_FIELDS).first()
        if first is None:
            self.start = Start(run.pk, run.first_step, "pre", MISSING)
            return {}, self.start
        seq, step, at, kind, data, _ = first
        self.read += 1
        parent = _parent_of(run) if hops < MAX_HOPS else None
        if parent is not None and kind in (SnapshotKind.FORK, SnapshotKind.FULL):
            parent_run, source_seq = parent
            state, start = self.run(parent_run, source_seq, hops + 1)
            before = resolve(state, self.path)
            if kind == SnapshotKind.FORK:
                ops = [op for op in data or () if _reaches(op[1], self.path)]
                state = work.apply(state, ops, run.pk, step, at) if ops else state
                how = self._how(ops, edit=True)
            else:
                kind_, words = self._how_from_index(first[5])
                state, how = work.whole(data), (kind_, f"edited before the step; {words}")
            self._record(run.pk, step, at, seq, before, state, how, inherited)
        elif kind == SnapshotKind.FORK:  # a fork whose parent is gone: nothing to start from
            state, start = {}, Start(run.pk, step, at, MISSING)
            self.start = start
        else:
            state = work.whole(data if kind == SnapshotKind.FULL else {})
            start = Start(run.pk, step, at, resolve(state, self.path))
            self.start = start
        first_seq = seq
        run_id = run.pk
        now: Any = _UNKNOWN  # the value at the path in `state`, once a row has resolved it
        for seq, step, at, kind, data, paths in _touching(run_id, self.path, first_seq, upto_seq):
            if data is _SPLICED_AFTER:
                state = work.skipped(state)
                now = _UNKNOWN
                continue
            self.read += 1
            if kind == SnapshotKind.DELTA:
                if not data:  # (a delta's data here: its ops that reach the path)
                    continue
                before = resolve(state, self.path) if now is _UNKNOWN else now
                state = work.apply(state, data, run_id, step, at)
                how = partial(self._how, data, edit=at == "pre")  # words for a change only
            elif kind == SnapshotKind.FULL:
                before = resolve(state, self.path) if now is _UNKNOWN else now
                state = work.whole(data)
                how = self._how_from_index(paths)
            else:
                continue
            now = self._record(run_id, step, at, seq, before, state, how, inherited)
        return state, start

    def _record(
        self,
        run_id: Any,
        step: int,
        at: str,
        seq: int,
        before: Any,
        state: Any,
        how: tuple[str, str] | Callable[[], tuple[str, str]],
        inherited: bool,
    ) -> Any:
        """Record a change if the value at the path differs from `before`; the value now."""
        after = resolve(state, self.path)
        if same(before, after):
            return after
        if callable(how):
            how = how()
        if before is MISSING:
            kind = "added"
        elif after is MISSING:
            kind = "removed"
        else:
            kind = how[0]
        self.changes.append(Change(run_id, step, at, seq, kind, how[1], before, after, inherited))
        if self.past_step is not None and not self.past and not inherited and step > self.past_step:
            self.past = True
        if self.limit is not None and len(self.changes) > self.limit and self.past:
            self.stopped = True
            raise _Enough
        return after

    def _how(self, ops: list, *, edit: bool) -> tuple[str, str]:
        """(kind for a value that changed, words) from the ops that reached the path."""
        words: list[str] = []
        moved = False
        for op in ops:
            rel = _relation(op, self.path)
            where = format_path(op[1]) or "the whole state"
            if rel == "set":
                words.append("set")
            elif rel == "del":
                words.append("deleted")
            elif rel == "splice":
                moved = True
                words.append(f"list {where} spliced")
            elif rel == "ancestor":
                words.append(f"{where} {'replaced' if op[0] == 'set' else 'deleted'}")
            elif rel == "inside":
                words.append(f"changed inside ({format_path(op[1])})")
        words = list(dict.fromkeys(words))
        if edit:
            words.insert(0, "edited before the step")
        kind = "moved" if moved and not any(w == "set" for w in words) else "set"
        text = "; ".join(words[:4]) + (f" (+{len(words) - 4} more)" if len(words) > 4 else "")
        return kind, text or "changed"

    def _how_from_index(self, paths: str) -> tuple[str, str]:
        """Words for a keyframe's change: its ops are not stored, the paths they touched are."""
        norm = [_token(s) for s in self.path[:INDEX_DEPTH]]
        words = []
        for line in (paths or "").split("\n"):
            if not line.startswith("$"):
                continue
            line = _MARK.sub("", line)
            tokens = [t for t in line[1:].split("/")[1:]]
            if tokens[: len(norm)] != norm[: len(tokens)]:
                continue
            keys = [t.replace("~2", "\n").replace("~1", "/").replace("~0", "~") for t in tokens]
            where = "".join(f"[{k}]" if k == "#" else f".{k}" for k in keys).lstrip(".")
            if len(tokens) > len(norm) or (len(tokens) == len(norm) < len(self.path)):
                words.append(f"changed inside ({where})")
            elif len(tokens) == len(self.path):
                words.append("set")
            else:
                words.append(f"{where or 'the whole state'} replaced")
        text = "; ".join(words[:4]) + (f" (+{len(words) - 4} more)" if len(words) > 4 else "")
        return "set", text or "changed"


#: Snapshots read per query: a scan that stops early reads few more than it needs.
_BATCHES = (64, 256, 1024, 4096)


#: `_touching`'s data for a splice of the front list that starts after the watched item.
_SPLICED_AFTER = object()


def _touching(
    run_id: Any, path: Path, after_seq: int, upto_seq: int | None
) -> Iterable[tuple[Any, ...]]:
    """The run's snapshots after after_seq (up to upto_seq) that may have changed the
    value at path, oldest first: (seq, step, at, kind, data, paths). A delta's data is
    its ops that can reach the path (`_reaching`); a keyframe's, its state (read from
    the chain, it holds only the path's first key: see state_along).

    One query reads the index (the snapshots' paths, no data) and this process picks the
    rows from it (a dozen LIKEs a row cost PostgreSQL more than the read); their data is
    read a batch at a time, so a scan that stops early reads little. The splices of the
    front list that start after the watched item come with _SPLICED_AFTER for data: the scan
    only needs to know that its copy of the list ends at the item."""
    match = _matcher(path)
    upto = upto_seq if upto_seq is not None else 2**62
    rows = rawsql.fetch_all(
        _index_sql(), [rawsql.prep(Snapshot, "run_id", run_id), after_seq, upto]
    )
    picked = [(*row, hit) for row in rows if (hit := match(row[4])) is not None]
    keyframes = [row[0] for row in rows if row[3] == SnapshotKind.FULL]
    at = 0
    for size in itertools.chain(_BATCHES, itertools.repeat(_BATCHES[-1])):
        if at >= len(picked):
            return
        batch = picked[at : at + size]
        at += size
        data = _data(run_id, [row for row in batch if row[5]], keyframes, path)
        for seq, step, at_, kind, paths, hit in batch:
            if not hit:
                yield seq, step, at_, kind, _SPLICED_AFTER, paths
            elif seq in data:  # (a row deleted since the index was read is passed over)
                yield seq, step, at_, kind, data[seq], paths


@cache
def _index_sql() -> str:
    """A run's index rows (seq, step, at, kind, paths) in (after, upto], REF rows left out:
    raw SQL, for 10,000 rows the ORM's model of a row costs more than the read."""
    c = partial(rawsql.column, Snapshot)
    return (
        f"SELECT {c('seq')}, {c('step')}, {c('at')}, {c('kind')}, {c('paths')}"  # noqa: S608
        f" FROM {rawsql.table(Snapshot)} WHERE {c('run_id')} = %s AND {c('seq')} > %s"
        f" AND {c('seq')} <= %s AND {c('kind')} <> '{SnapshotKind.REF.value}' ORDER BY {c('seq')}"
    )


def _data(
    run_id: Any, rows: list[tuple[Any, ...]], keyframes: list[int], path: Path
) -> dict[int, Any]:
    """The data of these rows (seq, ...) of a run, by seq. Rows that are at least a
    quarter of their seq span, REF rows included (about half of a run's other rows: a
    value every step changes, as under a negative index), come from reads of the chain
    (snapshots.chain_texts: raw SQL, each keyframe's dictionary set once, the rows not
    wanted left compressed), in parts cut at the run's `keyframes`: one the rows want
    starts a part (this process may hold its text already), one they don't want is not
    read (a wanted delta packed against it reads it as a dictionary, as through the ORM).
    Sparse rows come through the ORM."""
    if not rows:
        return {}
    lo, hi = rows[0][0], rows[-1][0]
    if len(rows) < _DENSE_MIN or len(rows) * 4 < hi - lo + 1:
        deltas = {row[0] for row in rows if row[3] == SnapshotKind.DELTA}
        raw = ExpressionWrapper(F("data"), output_field=BinaryField())
        found = Snapshot.objects.filter(run_id=run_id, seq__in=[row[0] for row in rows])
        stored = [(seq, blob) for seq, blob in found.values_list("seq", raw) if blob is not None]
        # In one go: the keyframes they are packed against, and the groups of regrouped
        # ones, in a query per run, not one each.
        texts = inflate_many([blob for _, blob in stored])
        return {
            seq: _reaching(data, path) if seq in deltas else data
            for (seq, _), data in zip(stored, map(json.loads, texts), strict=True)
        }

    keep = {row[0] for row in rows}
    parts: list[list[int]] = [[lo, hi]]
    for seq in keyframes[bisect.bisect_right(keyframes, lo) : bisect.bisect_right(keyframes, hi)]:
        parts[-1][1] = seq - 1
        parts.append([seq if seq in keep else seq + 1, hi])
    out: dict[int, Any] = {}
    reaching, held = ops_reaching(path), state_along(path)
    rooted = {row[0] for row in rows if may_change_whole(row[4])}
    for first, last in parts:
        texts = snapshots.chain_texts(run_id, first, last, keep=keep) if first <= last else ()
        for seq, kind, text in texts:
            if text is None:
                continue
            out[seq] = reaching(text, seq in rooted) if kind == SnapshotKind.DELTA else held(text)
    return out


def state_along(path: Path) -> Callable[[bytes], Any]:
    """A keyframe's JSON text -> its state holding only the watched path's first key (its
    value whole), parsed up to that key's value: the working state need be right only
    along the path, and the state of a long run is mostly other keys."""
    key = path[0] if path else None
    if type(key) is not str:
        return json.loads
    decode = _DECODER.raw_decode

    def held(text: bytes) -> Any:
        s = text.decode("utf-8", "surrogatepass")
        if s[:1] != "{" or s[1:2] == "}":
            return json.loads(s)
        at = 1
        while True:
            name, end = decode(s, at)
            if type(name) is not str or s[end : end + 1] != ":":
                return json.loads(s)
            value, end = decode(s, end + 1)
            if name == key:
                return {key: value}
            if s[end : end + 1] == "}":
                return {}
            if s[end : end + 1] != ",":
                return json.loads(s)
            at = end + 1

    return held


_DECODER = json.JSONDecoder()
#: A change of the whole state: its op's path is empty.
_ROOT_OP = '",[]'
#: Keys that compact JSON writes as they are (printable ASCII but quote and backslash).
_PLAIN_KEY = re.compile(r"[ !#-\[\]-~]+")


def ops_reaching(path: Path) -> Callable[..., list]:
    """A delta's JSON text -> its ops that can reach `path` (`_reaches`), without parsing
    the ops after the last one that can. An op that reaches a path under the state's
    key K holds K in its own path, and compact JSON writes a plain key as "K", so the
    ops after the last "K" in the text can't reach it (but for a change of the whole
    state, looked for there unless `root` is False: the snapshot's index of paths says
    it has none). The ops before it are parsed one at a time: a "K" alone
    may lie in a value. A step's delta is mostly other values (a tool's result, a
    message), and parsing them was much of a dense scan's time."""
    key = path[0] if path else None

    def whole(text: Any, root: bool = True) -> list:
        return _reaching(json.loads(text), path)

    if type(key) is not str or not _PLAIN_KEY.fullmatch(key):
        return whole
    needle = '"' + key + '"'
    decode = _DECODER.raw_decode

    def cut(text: bytes, root: bool = True) -> list:
        s = text.decode("utf-8", "surrogatepass")
        last = s.rfind(needle)
        if s[:1] != "[" or (root and s.find(_ROOT_OP, max(last, 0)) >= 0):
            return whole(s)
        ops = []
        at = 1
        while at <= last:
            op, end = decode(s, at)
            if type(op) is not list or len(op) < 2 or s[end : end + 1] not in (",", "]"):
                return whole(s)
            if _reaches(op[1], path):
                ops.append(op)
            at = end + 1
        return ops

    return cut


#: Fewer rows than this are read through the ORM, however dense.
_DENSE_MIN = 32


def _matcher(path: Path) -> Any:
    """paths -> True (the change may reach `path`: read it), False (only a splice of the
    front list: its data is not needed), None (neither). `_may_touch`, in Python."""
    exact, below = _index_lines(path)
    front = _front(path)
    shift = _line(front.keys) + "~" if front is not None else None

    # One search of the whole text for a line that may reach the path: a line (framed by
    # newlines) equal to one of `exact`, or that starts with one of `below`.
    reaches = re.compile(
        "\n(?:"
        + "|".join([*(re.escape(line) + "\n" for line in sorted(exact)), *map(re.escape, below)])
        + ")"
    ).search

    def match(paths: str) -> bool | None:
        if not paths or reaches(paths):
            return True
        if shift is not None and "\n" + shift in paths:
            return False
        return None

    return match


# --- the value now, without the whole history -------------------------------------------

_UNKNOWN = object()
#: Snapshots read backwards from the newest before giving up on that way.
BACK_ROWS = 64


def value_now(run: Run, path: Path, upto_seq: int | None = None, scan: _Scan | None = None) -> Any:
    """The value at path in the run's latest snapshot (or its upto_seq one).

    Read backwards from the newest snapshots that may have changed it, when one of
    them sets the value (or a container above it) whole, as most changes do: the ops
    inside the value after it are applied to that. Else (a list on the way spliced, a
    negative index) forward from the latest keyframe, applying only the ops that reach
    the path; through a fork reference, the whole history."""
    counter = scan or _Scan(path)
    value = _now_backwards(run, path, upto_seq, counter)
    if value is _UNKNOWN:
        value = _now_from_keyframe(run, path, upto_seq, counter)
    return value


def _newest(run: Run, path: Path, upto_seq: int | None) -> Any:
    rows = Snapshot.objects.filter(run_id=run.pk).exclude(kind=SnapshotKind.REF)
    if upto_seq is not None:
        rows = rows.filter(seq__lte=upto_seq)
    return rows.filter(_may_touch(path)).order_by("-seq").values_list("seq", "kind", "data")


def _newest_rows(newest: Any) -> Iterator[tuple[str, Any]]:
    """(kind, data) of the newest few rows first, then of the older ones up to BACK_ROWS:
    the second batch continues below the first's last seq, so a snapshot a live run
    commits meanwhile can't shift a row into both."""
    first = list(newest[:8])
    yield from ((kind, data) for _, kind, data in first)
    if len(first) == 8:
        rest = newest.filter(seq__lt=first[-1][0])[: BACK_ROWS - 8]
        yield from ((kind, data) for _, kind, data in rest)


def _now_backwards(run: Run, path: Path, upto_seq: int | None, scan: _Scan) -> Any:
    if any(type(p) is int and p < 0 for p in path):
        return _UNKNOWN  # which item depends on the list's length
    inside: list[list] = []  # ops within the value, newest first
    newest = _newest(run, path, upto_seq)
    # The newest few first: most values are set whole by their latest change.
    for kind, data in _newest_rows(newest):
        scan.read += 1
        if kind == SnapshotKind.FULL:
            base = resolve(data, path)
            break
        if kind != SnapshotKind.DELTA:
            return _UNKNOWN
        base = _UNKNOWN
        for op in reversed(data):
            if not _reaches(op[1], path):
                continue
            rel = _relation(op, path)
            if rel == "sibling":
                continue  # another item of a list on the way (none spliced since)
            if rel == "inside":
                inside.append(op)
                continue
            if rel == "set":
                base = op[2]
            elif rel == "del" or (rel == "ancestor" and op[0] == "del"):
                base = MISSING
            elif rel == "ancestor":
                base = resolve(op[2], path[len(op[1]) :])
            else:  # a list on the way spliced: the index may name another item now
                return _UNKNOWN
            break
        if base is not _UNKNOWN:
            break
    else:
        return _UNKNOWN
    if not inside:
        return base
    if base is MISSING:
        return _UNKNOWN
    ops = [[op[0], op[1][len(path) :], *op[2:]] for op in reversed(inside)]
    try:
        return delta.patch(base, ops)
    except delta.DeltaError:
        return _UNKNOWN


def _now_from_keyframe(run: Run, path: Path, upto_seq: int | None, scan: _Scan) -> Any:
    last = Snapshot.objects.filter(run_id=run.pk)
    if upto_seq is not None:
        last = last.filter(seq__lte=upto_seq)
    keyframe_seq = last.order_by("-seq").values_list("keyframe_seq", flat=True).first()
    keyframe = (
        Snapshot.objects.filter(run_id=run.pk, seq=keyframe_seq).values_list("kind", "data").first()
    )
    if keyframe is None or keyframe[0] != SnapshotKind.FULL:
        return history(
            run,
            path,
            (upto_seq // 2, "post" if upto_seq % 2 else "pre") if upto_seq is not None else None,
        ).current
    scan.read += 1
    work = _Working(path, scan)
    state = work.whole(keyframe[1])
    assert keyframe_seq is not None
    for _, step, at, kind, data, _ in _touching(run.pk, path, keyframe_seq, upto_seq):
        if data is _SPLICED_AFTER:
            state = work.skipped(state)
            continue
        scan.read += 1
        if kind == SnapshotKind.DELTA:
            state = work.apply(state, data, run.pk, step, at) if data else state
        elif kind == SnapshotKind.FULL:
            state = work.whole(data)
    return resolve(state, path)


class _Reload(Exception):
    """A splice pulled an item the working state does not hold down to the watched one."""


def _patch(state: Any, ops: list, depth: int, front: _Front | None = None) -> Any:
    """delta.patch, but containers above `depth` (the watched path's) are changed in place.

    The working state is this scan's own (decoded from the database for it), and the
    values it records are subtrees at the watched depth, which stay copy-on-write: a
    container never changes depth, so none above it is ever part of a recorded value.
    Appending to a 20,000-item list then costs the append, not a copy of the list.

    With a `front` list, the state holds that list up to the watched item only (see
    `_trim`): ops on later items are passed over, and a splice that removes more items
    than it inserts before the watched one raises _Reload (the state must be read whole).
    """
    root = [state]
    owned: set[int] = set()
    fkeys = front.keys if front is not None else None
    for op in ops:
        name, path = op[0], op[1]
        if name not in ("set", "del", "splice") or not isinstance(path, list):
            raise delta.DeltaError(f"malformed op: {op!r}")
        clamp = False
        if fkeys is not None and path[: len(fkeys)] == fkeys:
            assert front is not None
            k = len(fkeys)
            if len(path) > k and type(path[k]) is int and path[k] > front.index:
                continue  # a later item: not held
            if name == "splice" and len(path) == k:
                if type(op[2]) is not int or op[2] > front.index:
                    continue  # starts after the watched item: changes none up to it
                if op[3] > len(op[4]):
                    raise _Reload
                clamp = True
        walk = path if name == "splice" else path[:-1]
        if name != "splice" and not path:
            if name == "del":
                raise delta.DeltaError(f"cannot delete the whole value: {op!r}")
            root[0] = op[2]
            continue
        parent: Any = root
        key: Any = 0
        node = root[0]
        for level in range(len(walk) + 1):
            if level >= depth and id(node) not in owned:
                if type(node) is dict:
                    node = dict(node)
                elif type(node) is list:
                    node = list(node)
                else:
                    raise delta.DeltaError(f"path goes through a scalar: {op!r}")
                owned.add(id(node))
                parent[key] = node
            if level == len(walk):
                break
            step = walk[level]
            in_dict = type(node) is dict and type(step) is str and step in node
            in_list = type(node) is list and type(step) is int and 0 <= step < len(node)
            if not (in_dict or in_list):
                raise delta.DeltaError(f"{step!r} is not on the path of {op!r}")
            parent, key, node = node, step, node[step]
        if name == "splice":
            start, dropped, items = op[2], op[3], op[4]
            if clamp and type(node) is list and 0 <= start <= len(node):
                # The list is held up to the watched item: what it drops past its end
                # was not held, what it inserts past the item is not kept.
                assert front is not None
                dropped = min(dropped, len(node) - start)
                items = items[: front.index + 1 - start]
            if type(node) is not list or not 0 <= start <= start + dropped <= len(node):
                raise delta.DeltaError(f"splice does not fit: {op!r}")
            node[start : start + dropped] = items
        elif type(node) is dict and type(path[-1]) is str:
            if name == "set":
                node[path[-1]] = op[2]
            elif node.pop(path[-1], _GONE) is _GONE:
                raise delta.DeltaError(f"no such key to delete: {op!r}")
        elif name == "set" and type(node) is list and type(path[-1]) is int:
            if not 0 <= path[-1] < len(node):
                raise delta.DeltaError(f"index out of range: {op!r}")
            node[path[-1]] = op[2]
        else:
            raise delta.DeltaError(f"op does not fit: {op!r}")
    return _trim(root[0], front)


_GONE = object()


def _trim(state: Any, front: _Front | None) -> Any:
    """The state with its front list cut after the watched item, in place (the list is
    the scan's own: a recorded value lies below it, never holds it)."""
    if front is None:
        return state
    node = state
    for key in front.keys:
        if type(node) is not dict or key not in node:
            return state
        node = node[key]
    if type(node) is list and len(node) > front.index + 1:
        del node[front.index + 1 :]
    return state


def _own_spine(state: Any, path: Path) -> Any:
    """`state` with the containers on the way to `path` copied (the scan changes them in
    place). The scan also changes in place the containers above the watched depth on the
    way to a sibling item's op: that is safe because snapshots.load decodes a new state at
    every call (no cache of decoded states; one would need the scan to copy those too)."""
    root = copy(state)
    node = root
    for step in path[:-1]:
        key: Any = step if type(step) is str or type(node) is list else str(step)
        held = (type(node) is dict and key in node) or (
            type(node) is list and type(key) is int and -len(node) <= key < len(node)
        )
        if not held:
            break
        child = node[key]
        if type(child) not in (dict, list):
            break
        node[key] = child = copy(child)
        node = child
    return root


class _Working:
    """How far a scan's working state can be trusted: right along the watched path, and
    while splices of its front list that start after the watched item are passed over
    (`skipped`), that list held up to the item only (`partial`)."""

    def __init__(self, path: Path, scan: _Scan) -> None:
        self.path = path
        self.front = _front(path)
        self.scan = scan
        self.partial = False

    def whole(self, state: Any) -> Any:
        """A state read in full (a keyframe): every list is whole again."""
        self.partial = False
        return state

    def skipped(self, state: Any) -> Any:
        self.partial = True
        return _trim(state, self.front)

    def apply(self, state: Any, ops: list, run_id: Any, step: int, at: str) -> Any:
        """The working state after `ops`, the snapshot (step, at)'s."""
        try:
            return _patch(state, ops, len(self.path), self.front if self.partial else None)
        except _Reload:
            self.scan.read += 1
            self.partial = False
            return _own_spine(snapshots.load(run_id, step, at), self.path)


def _parent_of(run: Run) -> tuple[Run, int] | None:
    if not run.parent_id or not run.forked_from_id:
        return None
    source = Snapshot.objects.filter(pk=run.forked_from_id).values_list("seq", flat=True).first()
    parent = Run.objects.filter(pk=run.parent_id).first()
    if source is None or parent is None:
        return None
    return parent, source


# --- what the pages and the API show beside a change --------------------------------------

#: A value bigger than this (as compact JSON) is left out of the API's answer.
MAX_VALUE_BYTES = 64 * 1024


def value_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def step_details(changes: Iterable[Change]) -> dict[tuple[str, int], dict[str, Any]]:
    """{(run id, step): {"decision", "tool_calls"}} for the steps of `changes`, in two queries."""

    wanted: dict[str, set[int]] = {}
    for c in changes:
        wanted.setdefault(str(c.run_id), set()).add(c.step)
    if not wanted:
        return {}
    which = Q()
    for run_id, numbers in wanted.items():
        which |= Q(run_id=run_id, number__in=numbers)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    steps = Step.objects.filter(which).values_list("pk", "run_id", "number", "decision")
    by_pk: dict[Any, dict[str, Any]] = {}
    for pk, run_id, number, decision in steps:
        d = decision or {}
        entry = {
            "decision": None
            if decision is None
            else {
                "thought": str(d.get("thought") or ""),
                "rationale": str(d.get("rationale") or ""),
                "calls": [
                    {"tool": c.get("tool"), "args": c.get("args") or {}}
                    for c in d.get("calls") or ()
                    if isinstance(c, dict)
                ],
                "final": d.get("final"),
            },
            "tool_calls": [],
        }
        out[(str(run_id), number)] = by_pk[pk] = entry
    calls = (
        ToolCall.objects.filter(step_id__in=by_pk)
        .order_by("step_id", "index")
        .values_list("step_id", "index", "tool", "kind", "status")
    )
    for step_id, index, tool, kind, status in calls:
        by_pk[step_id]["tool_calls"].append(
            {"index": index, "tool": tool, "kind": kind, "status": status}
        )
    return out


def value_json(name: str, value: Any) -> dict[str, Any]:
    """{name: value, "truncated": bool}: null when absent or bigger than MAX_VALUE_BYTES."""
    if value is MISSING:
        return {name: None, "truncated": False}
    if value_size(value) > MAX_VALUE_BYTES:
        return {name: None, "truncated": True}
    return {name: value, "truncated": False}


def change_json(c: Change, details: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """A change as the API (and `manage.py watch --json`) shows it."""
    from django.urls import reverse

    before, after = value_json("before", c.before), value_json("after", c.after)
    detail = details.get((str(c.run_id), c.step), {})
    return {
        "run_id": c.run_id,
        "inherited": c.inherited,
        "step": c.step,
        "at": c.at,
        "kind": c.kind,
        "how": c.how,
        "before_exists": c.before_exists,
        "before": before["before"],
        "before_truncated": before["truncated"],
        "after_exists": c.after_exists,
        "after": after["after"],
        "after_truncated": after["truncated"],
        "decision": detail.get("decision"),
        "tool_calls": detail.get("tool_calls", []),
        "diff_url": reverse("debugger:step-diff", args=[c.run_id, c.step]),
    }
