"""The snapshot store: deltas from the previous snapshot, adaptive keyframes.

Each run's snapshots form a chain ordered by `seq` (2*step for pre, 2*step+1
for post). A snapshot is stored as
- REF: the same state as the previous snapshot (a pre that equals the post
  before it), no data;
- DELTA: ops (agentrun.store.delta) turning the previous state into this one;
- FULL: the whole state, a keyframe, written when the delta bytes since the
  last keyframe outweigh the state itself (a state mostly rewritten step after
  step waits longer: KEYFRAME_RATIO, KEYFRAME_ROWS);
- FORK: a fork's first snapshot: the state of its source snapshot in the
  parent run (`Run.forked_from`), plus ops when the state was edited. Its
  chain_bytes include the source's (and a share of the state per hop), so the
  keyframe rule bounds a read that crosses into the parent runs too.
Reading any snapshot costs one keyframe plus at most a state's worth of
deltas (KEYFRAME_RATIO states' worth in at most KEYFRAME_ROWS rows for one
mostly rewritten); total storage stays within a small multiple of what changed. `data`
is stored zlib-compressed (models.CompressedJSONField).
"""

from __future__ import annotations

import gc
import json
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db.models import BinaryField, ExpressionWrapper, F
from django.db.models.base import ModelState

from agentrun.models import CompressedJSONField, Snapshot, SnapshotKind
from agentrun.store import delta, hashing, rawsql
from agentrun.store.codec import (
    FULL_WINDOW,
    GROUP,
    Inflater,
    Prepared,
    dictionary_key,
    inflate,
    json_text,
    pack,
    pack_text,
    packed_against,
    remember_dictionary,
    remembered_dictionary,
)
from agentrun.store.paths import touched_paths


@dataclass(frozen=True)
class Encoded:
    kind: str
    data: Any
    node: hashing.Node
    stored_bytes: int
    chain_bytes: int
    keyframe_seq: int
    paths: str = ""  # Snapshot.paths: what the change touched


def _json_bytes(value: Any) -> int:
    return len(
        json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )
    )


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
        return Encoded(SnapshotKind.FULL, state, node, node.size, 0, seq, WHOLE)
    ops = delta.diff(prev_state, state)
    if not ops:
        node = prev_node or hashing.build(state)
        return Encoded(SnapshotKind.REF, None, node, 0, prev.chain_bytes, prev.keyframe_seq)
    node = hashing.apply(prev_node, ops) if prev_node is not None else hashing.build(state)
    ops_bytes = _json_bytes(ops)
    chain = prev.chain_bytes + ops_bytes
    paths = touched_paths(ops)
    if chain > node.size and (
        node.size - prev.size >= ops_bytes // 2  # a state that grows: keyframe now
        or chain > node.size * KEYFRAME_RATIO
        or seq - prev.keyframe_seq >= KEYFRAME_ROWS
    ):
        return Encoded(SnapshotKind.FULL, state, node, node.size, 0, seq, paths)
    return Encoded(SnapshotKind.DELTA, ops, node, ops_bytes, chain, prev.keyframe_seq, paths)


# A keyframe costs a state's bytes; the deltas since the last one cost each read that
# replays them. A keyframe is due once those deltas outweigh the state. A state that
# grows (a conversation) gets it then: the keyframes' bytes are a fraction of the
# deltas' anyway, and the next one is due only when the deltas outweigh the bigger
# state. A state that is mostly rewritten (a window over the last messages, slots
# overwritten) would get one every few steps, as many bytes again as its deltas: it
# waits until the deltas outweigh it KEYFRAME_RATIO times or a read would replay
# KEYFRAME_ROWS rows (reads skip the pre rows that refer to the post before them).
KEYFRAME_RATIO = 4
KEYFRAME_ROWS = 96

# Snapshot.paths of a run's first state: all of it is new.
WHOLE = "\n$\n"


def _phase(state: Any) -> str:
    return str(state.get("phase", "")) if isinstance(state, dict) else ""


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
    snapshot = rawsql.instance(
        Snapshot,
        {
            "run_id": run_id,
            "step": step,
            "at": at,
            "seq": seq,
            "kind": enc.kind,
            "data": enc.data,
            "keyframe_seq": enc.keyframe_seq,
            "hash": enc.node.hex,
            "size": enc.node.size,
            "stored_bytes": enc.stored_bytes,
            "chain_bytes": enc.chain_bytes,
            "phase": _phase(state),
            "outcome": outcome,
            "paths": enc.paths,
        },
    )
    return snapshot, enc.node


def reference(run_id: Any, step: int, at: str, prev: Snapshot) -> Snapshot:
    """An unsaved REF snapshot: the same state as `prev`, stored as nothing."""
    # Built the fast way: a chained commit makes one per step.
    return rawsql.instance(
        Snapshot,
        {
            "run_id": run_id,
            "step": step,
            "at": at,
            "seq": Snapshot.seq_for(step, at),
            "kind": SnapshotKind.REF,
            "data": None,
            "keyframe_seq": prev.keyframe_seq,
            "hash": prev.hash,
            "size": prev.size,
            "stored_bytes": 0,
            "chain_bytes": prev.chain_bytes,
            "phase": prev.phase,
            "outcome": "",
        },
    )


def insert_values(snapshot: Snapshot) -> tuple[dict[str, Any], bytes | None]:
    """The fields to insert an unsaved snapshot with, and the JSON text of its data.

    A delta is packed against its keyframe's text (codec.pack_text), which every read
    of it reads first. Its text is also the dictionary its step's read results are
    packed against (`pack_result`). Once the insert is committed, `committed(snapshot,
    text)` lets the next deltas find their keyframe's text in memory.
    """
    values = rawsql.insert_fields(snapshot)
    if snapshot.kind not in (SnapshotKind.DELTA, SnapshotKind.FULL):
        return values, None
    text = json_text(snapshot.data).encode()
    data: bytes | None = None
    if snapshot.kind == SnapshotKind.DELTA:
        # Only from memory: a query at every commit costs more than the bytes it saves
        # (a worker with a thousand runs in flight); a delta not packed is stored plain.
        keyframe = remembered_dictionary(snapshot.run_id, snapshot.keyframe_seq)
        if keyframe is not None:
            data = pack_text(text, snapshot.run_id, snapshot.keyframe_seq, keyframe)
    values["data"] = data or Prepared(zlib.compress(text, CompressedJSONField.level))
    return values, text


def committed(snapshot: Snapshot, text: bytes | None) -> None:
    """A snapshot written with insert_values is committed: keep a keyframe's text."""
    if text is not None and snapshot.kind == SnapshotKind.FULL:
        remember_dictionary(snapshot.run_id, snapshot.seq, text)


def pack_result(result: Any, snapshot: Snapshot, text: bytes | None) -> Any:
    """A read call's result as stored with its step's post `snapshot` (a delta whose JSON
    text is `text`): the agent has put it in its state, so the delta holds it already,
    and the result is stored as what the delta lacks. Reading it reads the delta too."""
    if result is None or text is None or snapshot.kind != SnapshotKind.DELTA:
        return result
    return pack(result, snapshot.run_id, snapshot.seq, text)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Decoding and hashing a big state builds thousands of containers that all stay
    alive, and the cyclic GC rescans them (and everything else alive) again and again:
    a third of a long history's time. None of them is garbage; pause it meanwhile."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Reading through a fork reference hops into the source's run, whatever the bytes:
# each hop counts as a sixteenth of the state, so a read crosses at most 16 runs
# (forks of forks of ...) before it meets a keyframe.
FORK_HOP_SHARE = 16


def fork(
    run_id: Any,
    step: int,
    source: Snapshot,
    source_state: dict[str, Any],
    state: dict[str, Any],
    ops: list | None = None,
) -> tuple[Snapshot, hashing.Node]:
    """An unsaved first (pre) snapshot of fork `run_id`, whose `forked_from` is `source`.

    It refers to `source` instead of copying the state, with the edit's ops
    (`delta.diff(source_state, state)`, computed here unless given) when the
    state was edited; a keyframe when the read it would cost outweighs the state.
    """
    if ops is None:
        ops = delta.diff(source_state, state) if state is not source_state else []
    with gc_paused():
        node = hashing.build(state)
    ops_bytes = _json_bytes(ops) if ops else 0
    chain = source.chain_bytes + ops_bytes + node.size // FORK_HOP_SHARE
    seq = Snapshot.seq_for(step, "pre")
    if chain > node.size:
        kind, data, stored_bytes, chain = SnapshotKind.FULL, state, node.size, 0
    else:
        kind, data, stored_bytes = SnapshotKind.FORK, ops or None, ops_bytes
    snapshot = Snapshot(
        run_id=run_id,
        step=step,
        at="pre",
        seq=seq,
        kind=kind,
        data=data,
        keyframe_seq=seq,
        hash=node.hex,
        size=node.size,
        stored_bytes=stored_bytes,
        chain_bytes=chain,
        phase=_phase(state),
        outcome="",
        paths=touched_paths(ops),
    )
    return snapshot, node


# --- reading -------------------------------------------------------------------


def _fork_source_state(run_id: Any) -> Any:
    return load_state(Snapshot.objects.get(forks__pk=run_id))


def _replay(run_id: Any, rows: Iterable[tuple[int, str, Any]]) -> Iterator[tuple[int, Any]]:
    """(seq, state) for each of a run's (seq, kind, data) rows, from a keyframe or fork on."""
    state: Any = None
    for seq, kind, data in rows:
        if kind == SnapshotKind.DELTA:
            state = delta.patch(state, data)
        elif kind == SnapshotKind.FULL:
            state = data
        elif kind == SnapshotKind.FORK:
            state = _fork_source_state(run_id)
            if data:
                state = delta.patch(state, data)
        yield seq, state


# The data column as its stored bytes: _Decoder turns them into values in seq order.
_RAW = ExpressionWrapper(F("data"), output_field=BinaryField())


class _Decoder:
    """Decodes one run's stored data in seq order: a delta packed against its keyframe
    takes the keyframe's text from the row read just before it, not from a query of its
    own that would read and decompress the keyframe a second time (codec.inflate)."""

    def __init__(self, run_id: Any) -> None:
        self.run_id = run_id
        self.inflate = Inflater()
        self.text = b""  # the JSON text of the last value decoded

    def __call__(self, seq: int, kind: str, blob: Any) -> Any:
        if blob is None:
            return None
        text = self.text = self.inflate(blob)
        if kind == SnapshotKind.FULL:
            self.inflate.keyframe(self.run_id, seq, text)
        return json.loads(text)


def chain(
    run_id: Any, first_seq: int, last_seq: int, refs: bool = False
) -> list[tuple[int, str, Any]]:
    """(seq, kind, data) of a run's rows from first_seq to last_seq, in one round trip,
    data decoded; `refs`: with the REF rows, which change nothing (a replay that wants
    only the last state needs just the rows with data). Raw SQL: the ORM's own work per
    row costs more than decoding a delta."""
    return [
        (seq, kind, None if text is None else json.loads(text))
        for seq, kind, text in chain_texts(run_id, first_seq, last_seq, refs)
    ]


def chain_texts(
    run_id: Any, first_seq: int, last_seq: int, refs: bool = False, keep: set[int] | None = None
) -> Iterator[tuple[int, str, bytes | None]]:
    """(seq, kind, JSON text or None) of a run's rows from first_seq to last_seq, from one
    query: each keyframe's dictionary is set once for the deltas after it (Inflater). A
    keyframe at first_seq whose text this process read before (_KEYFRAMES) is not sent
    again: the row's hash says it is the same text (a run deleted and imported again
    under its id may hold another). `keep`: only these rows are yielded, and the other
    deltas are not inflated (keyframes are: the deltas after them are packed against them;
    so are the holders of regrouped deltas, agentrun.store.compaction)."""
    known = _keyframe_text(run_id, first_seq)
    params = [first_seq, known[0] if known else b"", rawsql.prep(Snapshot, "run_id", run_id)]
    rows = rawsql.fetch_all(_chain_sql(refs), [*params, first_seq, last_seq], binary=True)
    inflater = Inflater()
    for seq, kind, blob, digest in rows:
        # (A regrouped delta's holder is read too: the rows after it are parts of its text.)
        held = kind == SnapshotKind.FULL or (blob is not None and blob[:1] == GROUP)
        if keep is not None and seq not in keep and not held:
            continue
        if blob is not None:
            text = inflater(blob)
            if kind == SnapshotKind.FULL:
                _keep_keyframe_text(run_id, seq, bytes(digest), text)
        elif known is not None and seq == first_seq and kind == SnapshotKind.FULL:
            text = known[1]
        else:
            yield seq, kind, None
            continue
        if kind == SnapshotKind.FULL:
            inflater.keyframe(run_id, seq, text)
        if keep is None or seq in keep:
            yield seq, kind, text


def inflate_results(
    run_id: Any, blobs: list[bytes | None], *, gone_as_none: bool = False
) -> list[bytes | None]:
    """The JSON text of stored tool results of one run (None stays None).

    A read's result is packed against its step's post delta (codec.pack), and a delta
    against its keyframe: one by one, inflate() reads each delta, and the keyframe
    under it, with a query a batch. Here the deltas the results name are read in one
    pass of the run's chain from the first one's keyframe on (as chain() does: one query,
    each keyframe's dictionary set once), and each result is inflated against its
    delta's text. A result that names another run's snapshot goes to inflate().
    `gone_as_none`: a result whose delta is gone (a purge under way) reads as None, with
    no query of its own, instead of raising ValueError.
    """
    blobs = [b if b is None or type(b) is bytes else bytes(b) for b in blobs]
    against = [None if b is None else packed_against(b, run_id) for b in blobs]
    seqs = {seq for seq in against if seq is not None}
    tails = _snapshot_tails(run_id, seqs) if seqs else {}
    if not gone_as_none:
        return [None if b is None else inflate(b, tails) for b in blobs]
    out: list[bytes | None] = []
    for b, seq in zip(blobs, against, strict=True):
        if b is None or (seq is not None and dictionary_key(run_id, seq) not in tails):
            out.append(None)
            continue
        try:
            out.append(inflate(b, tails))
        except (ValueError, zlib.error):
            out.append(None)
    return out


def _snapshot_tails(run_id: Any, seqs: set[int]) -> dict[bytes, bytes]:
    """The dictionaries (last FULL_WINDOW bytes of the JSON text) of these snapshots of a
    run, by locator, from one read of its chain."""
    first = min(seqs)
    # The keyframe under the first of them that still exists (all of them, but during a purge).
    start = (
        Snapshot.objects.filter(run_id=run_id, seq__gte=first, seq__lte=max(seqs))
        .exclude(kind=SnapshotKind.REF)
        .order_by("seq")
        .values_list("keyframe_seq", flat=True)
        .first()
    )
    if start is None:
        return {}
    return {
        dictionary_key(run_id, seq): text[-FULL_WINDOW:]
        for seq, _, text in chain_texts(run_id, min(start, first), max(seqs), keep=seqs)
        if text is not None
    }


@cache
def _chain_sql(refs: bool) -> str:
    # Quoted names of our own table and columns, a constant kind: nothing from a caller.
    seq, kind = rawsql.column(Snapshot, "seq"), rawsql.column(Snapshot, "kind")
    data, run = rawsql.column(Snapshot, "data"), rawsql.column(Snapshot, "run_id")
    digest = rawsql.column(Snapshot, "hash")
    where = f"{run} = %s AND {seq} >= %s AND {seq} <= %s"
    if not refs:
        where += f" AND {kind} <> '{SnapshotKind.REF.value}'"
    table = rawsql.table(Snapshot)
    return (
        f"SELECT {seq}, {kind}, CASE WHEN {seq} = %s AND {digest} = %s THEN NULL ELSE {data} END,"  # noqa: S608
        f" CASE WHEN {kind} = '{SnapshotKind.FULL.value}' THEN {digest} END"
        f" FROM {table} WHERE {where} ORDER BY {seq}"
    )


# The JSON text of keyframes this process has read, with their hashes: a read of a
# snapshot after one of them replays from it without reading it again. Bounded by bytes.
_KEYFRAMES: OrderedDict[tuple[str, int], tuple[bytes, bytes]] = OrderedDict()
_KEYFRAMES_MAX_BYTES = 32 * 1024 * 1024
_KEYFRAMES_LOCK = threading.Lock()
_keyframes_bytes = 0


def _keyframe_text(run_id: Any, seq: int) -> tuple[bytes, bytes] | None:
    key = (str(run_id), seq)
    with _KEYFRAMES_LOCK:
        found = _KEYFRAMES.get(key)
        if found is not None:
            _KEYFRAMES.move_to_end(key)
        return found


def _keep_keyframe_text(run_id: Any, seq: int, digest: bytes, text: bytes) -> None:
    global _keyframes_bytes
    if len(text) > _KEYFRAMES_MAX_BYTES // 4:
        return
    key = (str(run_id), seq)
    with _KEYFRAMES_LOCK:
        old = _KEYFRAMES.pop(key, None)
        _keyframes_bytes += len(text) - (len(old[1]) if old else 0)
        _KEYFRAMES[key] = (digest, text)
        while _keyframes_bytes > _KEYFRAMES_MAX_BYTES:
            _keyframes_bytes -= len(_KEYFRAMES.popitem(last=False)[1][1])


def forget_keyframe_texts() -> None:
    """Empty this process's keyframe texts (as in another process: tests, benchmarks)."""
    global _keyframes_bytes
    with _KEYFRAMES_LOCK:
        _KEYFRAMES.clear()
        _keyframes_bytes = 0


def load_state(snapshot: Snapshot) -> dict[str, Any]:
    """The exact state stored at `snapshot`: its keyframe plus the deltas after it."""
    if snapshot.kind == SnapshotKind.FULL and "data" not in snapshot.get_deferred_fields():
        return snapshot.data
    rows = chain(snapshot.run_id, snapshot.keyframe_seq, snapshot.seq)
    last: tuple[int, Any] = (snapshot.seq, None)
    with gc_paused():
        for last in _replay(snapshot.run_id, rows):  # noqa: B007 - the last state is the answer
            pass
    return last[1]


def get(run_id: Any, step: int, at: str) -> Snapshot:
    """The snapshot row, its data deferred: a delta's data is read by load_state with the
    rest of its chain (decoding it here would read its keyframe a second time)."""
    return Snapshot.objects.defer("data").get(run_id=run_id, seq=Snapshot.seq_for(step, at))


def load(run_id: Any, step: int, at: str) -> dict[str, Any]:
    return load_state(get(run_id, step, at))


# created_at is left out (deferred on the instances): converting 2,000 timestamps
# costs as much as patching the states.
_FIELDS = [f.attname for f in Snapshot._meta.concrete_fields if f.attname != "created_at"]
_DATA = _FIELDS.index("data")
_SEQ, _KIND = _FIELDS.index("seq"), _FIELDS.index("kind")


def history(run_id: Any) -> list[tuple[Snapshot, dict[str, Any]]]:
    """Every snapshot of a run with its state, in order, in one pass.

    The Snapshot instances have everything but `created_at` loaded.
    """
    with gc_paused():
        raw = [f if f != "data" else _RAW for f in _FIELDS]
        rows = list(Snapshot.objects.filter(run_id=run_id).order_by("seq").values_list(*raw))
        decode = _Decoder(run_id)
        rows = [(*r[:_DATA], decode(r[_SEQ], r[_KIND], r[_DATA]), *r[_DATA + 1 :]) for r in rows]
        states = _replay(run_id, ((r[_SEQ], r[_KIND], r[_DATA]) for r in rows))
        return [(_instance(row), state) for row, (_, state) in zip(rows, states, strict=True)]


def _instance(row: tuple[Any, ...]) -> Snapshot:
    """A loaded Snapshot from a row of _FIELDS, `created_at` deferred: what Model.from_db
    makes, in a quarter of its time (a history makes one per snapshot, two per step). No
    model signal is connected to Snapshot."""
    snapshot = Snapshot.__new__(Snapshot)
    snapshot.__dict__.update(zip(_FIELDS, row, strict=True))
    state = snapshot._state = ModelState()
    state.adding, state.db = False, "default"
    return snapshot
