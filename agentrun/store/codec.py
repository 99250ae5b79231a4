"""How stored values are compressed: zlib streams, packed against another snapshot's text,
or regrouped with their neighbours.

A value is stored as one of
- a plain zlib stream of its compact JSON text;
- packed: a zlib stream whose preset dictionary is the end of another snapshot's text (a
  delta against its keyframe, a read call's result against its step's post delta), named by
  a locator (the run's id and the snapshot's seq);
- grouped: one zlib stream for many consecutive deltas of a finished run, kept by the first
  of them, each other naming its part (`agentrun.store.compaction`).

`inflate` turns any of them back into the JSON text; `Inflater` does it for a replay that
reads many deltas packed against the same keyframe. The texts it needs (dictionaries,
groups) come from memory or from the snapshots table, one query per run.
"""

from __future__ import annotations

import json
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from django.apps import apps
from django.db import models

_isal_zlib: Any
try:  # ISA-L's inflate (the isal package): zlib's streams, faster; see _decompress
    from isal import isal_zlib as _isal_zlib
except ImportError:  # no wheel for this platform: zlib does the same work
    _isal_zlib = None

#: zlib's level for every stored value: ~45 ms for a 1.2 MB keyframe, rare; a step's few
#: KB take ~0.05 ms.
LEVEL = 6


def _snapshots() -> Any:
    return apps.get_model("agentrun", "Snapshot").objects


def json_text(value: Any) -> str:
    """Compact JSON, as the JSON columns store it; a lone surrogate (not UTF-8 encodable) is kept as a \\u escape."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


class Prepared(bytes):
    """A compressed column value computed already: stored as it is."""


# A value packed against another snapshot's JSON text, as zlib's preset dictionary:
# - a read call's result against its step's post delta, which holds the same text once
#   the agent has put the result in its state: the result costs what the delta lacks;
# - a delta against the end of its keyframe's text, which the reads of the delta read
#   first anyway: the run's own words, names and keys are then cheap to repeat.
# Its bytes: a mark, the run's id (16 bytes), the seq of the run's snapshot whose data is
# the dictionary (4 bytes, big-endian), then a zlib stream whose header holds the
# dictionary's checksum. The mark says how much of the text's end is the dictionary:
# FULL_WINDOW (zlib looks back 32 KiB at most), or SHORT_WINDOW, which deltas were packed
# with before a replay set each dictionary once (Inflater): the full one stores a tenth
# less. A zlib stream never starts with a mark (its first byte has 8 in its low bits).
FULL_WINDOW, SHORT_WINDOW = 32 * 1024, 8 * 1024
_WINDOWS = {b"\x01": FULL_WINDOW, b"\x02": SHORT_WINDOW}
_MARKS = {size: mark for mark, size in _WINDOWS.items()}
PACKED = 0x01  # the mark of a result (FULL_WINDOW)
_LOCATOR = 1 + 16 + 4

# The last FULL_WINDOW bytes of recently used dictionaries, by locator (run id bytes + seq).
# Snapshots never change; a run deleted and imported again under its id may hold other
# text, which the stream's checksum catches: then the dictionary is read again (inflate).
# Bounded by their bytes, not their number: a worker with a thousand small runs in flight
# keeps each one's keyframe tail, and a few big ones don't crowd out the memory.
_TAILS: OrderedDict[bytes, bytes] = OrderedDict()
_TAILS_MAX_BYTES = 16 * 1024 * 1024
_TAILS_BYTES = 0
_TAILS_LOCK = threading.Lock()


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _key(run_id: Any, seq: int) -> bytes:
    return _uuid(run_id).bytes + seq.to_bytes(4, "big")


def dictionary_key(run_id: Any, seq: int) -> bytes:
    """The locator of snapshot `seq` of `run_id`, as a packed value names its dictionary."""
    return _key(run_id, seq)


def packed_against(blob: bytes, run_id: Any) -> int | None:
    """The seq of the snapshot of `run_id` that a stored value is packed against, or None
    (compressed alone, or packed against another run's snapshot)."""
    if blob[:1] not in _WINDOWS or blob[1:17] != _uuid(run_id).bytes:
        return None
    return int.from_bytes(blob[17:_LOCATOR], "big")


def remember_dictionary(run_id: Any, seq: int, text: bytes) -> None:
    """Keep the text of a snapshot this process has just committed (or read)."""
    global _TAILS_BYTES
    key = _key(run_id, seq)
    tail = text[-FULL_WINDOW:]
    with _TAILS_LOCK:
        _TAILS_BYTES += len(tail) - len(_TAILS.pop(key, b""))
        _TAILS[key] = tail
        while _TAILS_BYTES > _TAILS_MAX_BYTES and _TAILS:
            _TAILS_BYTES -= len(_TAILS.popitem(last=False)[1])


def forget_dictionaries() -> None:
    """Empty this process's dictionaries (as in another process: tests)."""
    global _TAILS_BYTES
    with _TAILS_LOCK:
        _TAILS.clear()
        _TAILS_BYTES = 0


def forget_dictionary(key: bytes) -> None:
    global _TAILS_BYTES
    with _TAILS_LOCK:
        _TAILS_BYTES -= len(_TAILS.pop(key, b""))


def remembered_dictionary(run_id: Any, seq: int) -> bytes | None:
    """The text tail of a snapshot if this process has it in memory; never a query."""
    return _TAILS.get(_key(run_id, seq))


#: Texts shorter than this are compressed alone too, whenever packing gained less than 4x.
_PLAIN_TRIED = 1024


def pack_text(
    text: bytes, run_id: Any, seq: int, zdict: bytes, window: int = FULL_WINDOW
) -> Prepared:
    """JSON `text` compressed against the last `window` bytes of `zdict`, the text of
    snapshot `seq` of `run_id` (or compressed alone, when that comes out smaller)."""
    z = zlib.compressobj(LEVEL, zdict=zdict[-window:])
    body = z.compress(text) + z.flush()
    if len(body) * 4 > len(text) and (len(text) < _PLAIN_TRIED or len(body) * 2 > len(text)):
        # The dictionary may have held little of it: compressed alone, is it as short?
        # Beyond a few hundred bytes, only when the text barely compressed: a text of
        # words packed 2-4x is one the dictionary helped more than the locator costs
        # (never once plain in bench's 2,000 steps of deltas, each tried; the second
        # compression was 6% of a step's instructions).
        plain = zlib.compress(text, LEVEL)
        if len(plain) <= len(body) + _LOCATOR:
            return Prepared(plain)
    return Prepared(_MARKS[window] + _key(run_id, seq) + body)


def pack(value: Any, run_id: Any, seq: int, zdict: bytes) -> Prepared:
    """pack_text for a JSON value."""
    return pack_text(json_text(value).encode(), run_id, seq, zdict)


def _stored(keys: set[bytes]) -> Iterator[tuple[uuid.UUID, list[tuple[int, bytes]]]]:
    """The stored values of the snapshots these locators name, one query per run:
    (run id, [(seq, value)]); a snapshot that is gone (or holds no data) is left out."""
    by_run: dict[bytes, list[int]] = {}
    for key in keys:
        by_run.setdefault(key[:16], []).append(int.from_bytes(key[16:], "big"))
    raw = models.ExpressionWrapper(models.F("data"), output_field=models.BinaryField())
    for run_bytes, seqs in by_run.items():
        run_id = uuid.UUID(bytes=run_bytes)
        rows = _snapshots().filter(run_id=run_id, seq__in=seqs).values_list("seq", raw)
        yield run_id, [(seq, bytes(data)) for seq, data in rows if data is not None]


def dictionaries(wanted: set[bytes]) -> dict[bytes, bytes]:
    """The (last FULL_WINDOW bytes of the) JSON text of these snapshots, by locator
    (`_key`), from memory or one query per run; a snapshot that is gone is left out."""
    found = {k: t for k in wanted if (t := _TAILS.get(k)) is not None}
    for run_id, rows in _stored(wanted - found.keys()):
        # Deltas are packed against their keyframe: those in one query too, not one each;
        # and so are the holders of regrouped ones.
        inner = {data[1:_LOCATOR] for _, data in rows if data[:1] in _WINDOWS}
        zdicts = dictionaries(inner) if inner else None
        groups = groups_of([data for _, data in rows])
        for seq, data in rows:
            text = inflate(data, zdicts, groups)
            remember_dictionary(run_id, seq, text)
            found[_key(run_id, seq)] = text[-FULL_WINDOW:]
    return found


def _unpack(blob: bytes, zdict: bytes, window: int) -> bytes | None:
    """The text of a packed value given its dictionary; None if it is not the one."""
    try:
        z = zlib.decompressobj(zdict=zdict if len(zdict) <= window else zdict[-window:])
        text = z.decompress(blob[_LOCATOR:])
    except zlib.error:
        return None
    if not z.eof:
        raise zlib.error("a packed value is truncated")
    return text


def _decompress(blob: bytes) -> bytes:
    """zlib.decompress, by ISA-L when it is installed: it inflates the same stream in
    about half the time (most of a long watch's scan, a whole history's, an export's).
    Errors are zlib's own (a damaged value is then inflated again by zlib to say why).
    A header whose window size zlib refuses (over 32 KiB) goes to zlib: ISA-L ignores it."""
    if _isal_zlib is not None and blob[:1] and blob[0] >> 4 <= 7:
        try:
            return _isal_zlib.decompress(blob)
        except _isal_zlib.error:
            pass
    return zlib.decompress(blob)


# A finished run's deltas regrouped (agentrun.store.compaction): the texts of consecutive deltas
# in one zlib stream, kept by the first of them (the group's holder), each delta's value
# naming its part. One stream a group instead of one a delta: about a third fewer bytes,
# and a scan of the run inflates a third as long (bench/bench_grouped_deltas.py).
# - the holder: GROUP, the locator of its own row, the head, then the zlib stream;
# - every other member: SLICE, the locator of the holder's row, the head;
# the head is the CRC-32 and the length of the group's text, and where the member's text
# lies in it (start, end); 4 bytes each, big-endian. CRC and length tell a group that is
# not the one a slice was cut from (a run deleted and imported again under its id, and
# regrouped again).
GROUP, SLICE = b"\x04", b"\x03"
_GROUP_HEAD = struct.Struct(">IIII")
GROUP_HEADER = _LOCATOR + _GROUP_HEAD.size

# The text of recently read groups, by locator: (CRC-32, text). Bounded by bytes; a text
# over a quarter of the bound is not kept (a group is cut at GROUP_MAX_BYTES anyway).
_GROUPS: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
_GROUPS_MAX_BYTES = 32 * 1024 * 1024
_GROUPS_BYTES = 0
_GROUPS_LOCK = threading.Lock()


def group_values(run_id: Any, holder_seq: int, texts: list[bytes], level: int) -> list[Prepared]:
    """The stored values of one group of `run_id`'s deltas, whose texts these are, in
    order; the first is the holder, snapshot `holder_seq`."""
    text = b"".join(texts)
    crc, key = zlib.crc32(text), _key(run_id, holder_seq)
    out, at = [], 0
    for part in texts:
        head = key + _GROUP_HEAD.pack(crc, len(text), at, at + len(part))
        out.append(Prepared(SLICE + head) if out else Prepared(GROUP + head))
        at += len(part)
    out[0] = Prepared(out[0] + zlib.compress(text, level))
    return out


def group_parts(values: list[bytes]) -> list[bytes]:
    """The text of each value of one group (the holder first), from these values alone:
    no cache, no query. What a compaction checks before it writes them."""
    holder = values[0]
    if holder[:1] != GROUP:
        raise zlib.error("a group starts with its holder")
    text = _decompress(holder[GROUP_HEADER:])
    crc, size = zlib.crc32(text), len(text)
    out = []
    for i, value in enumerate(values):
        if value[:1] != (GROUP if i == 0 else SLICE) or value[1:_LOCATOR] != holder[1:_LOCATOR]:
            raise zlib.error("a member of a group names another holder")
        head = _GROUP_HEAD.unpack_from(value, _LOCATOR)
        if head[:2] != (crc, size) or not head[2] <= head[3] <= size:
            raise zlib.error("a member of a group doesn't match it")
        out.append(text[head[2] : head[3]])
    return out


#: Group texts at hand, by locator: (CRC-32, text), as `groups_of` returns them.
Groups = dict[bytes, tuple[int, bytes]]


def groups_of(blobs: list[bytes]) -> Groups:
    """The texts of the groups that these stored values are members of, for the members
    whose holder is not among them: from memory, else one query per run. Reading sparse
    members one by one would read each holder in a query of its own (a watch of a value
    that a few steps of a regrouped run changed meets a new group at nearly every one).
    A holder that is gone is left out: reading the member then says so."""
    wanted = {b[1:_LOCATOR] for b in blobs if b[:1] == SLICE}
    if not wanted:
        return {}
    wanted -= {b[1:_LOCATOR] for b in blobs if b[:1] == GROUP}
    out: Groups = {k: found for k in wanted if (found := _GROUPS.get(k)) is not None}
    for run_id, rows in _stored(wanted - out.keys()):
        for seq, holder in rows:
            key = _key(run_id, seq)
            if holder[:1] == GROUP and holder[1:_LOCATOR] == key:
                text = _decompress(holder[GROUP_HEADER:])
                out[key] = (zlib.crc32(text), text)
                _keep_group(key, out[key])
    return out


def _keep_group(key: bytes, found: tuple[int, bytes]) -> None:
    global _GROUPS_BYTES
    if len(found[1]) > _GROUPS_MAX_BYTES // 4:
        return
    with _GROUPS_LOCK:
        _GROUPS_BYTES += len(found[1]) - len(_GROUPS.pop(key, (0, b""))[1])
        _GROUPS[key] = found
        while _GROUPS_BYTES > _GROUPS_MAX_BYTES and _GROUPS:
            _GROUPS_BYTES -= len(_GROUPS.popitem(last=False)[1][1])


def _group_text(
    key: bytes, crc: int, size: int, holder: bytes | None, groups: Groups | None = None
) -> bytes:
    """The text of the group held by the row at locator `key`; `holder`: that row's
    value when the caller has it; `groups`: group texts at hand (else from memory or
    the database)."""
    found = _GROUPS.get(key) if groups is None else groups.get(key) or _GROUPS.get(key)
    if found is not None and found[0] == crc and len(found[1]) == size:
        return found[1]  # (no move to the end: a scan meets a group's members in a row)
    if holder is None:
        run, seq = uuid.UUID(bytes=key[:16]), int.from_bytes(key[16:], "big")
        raw = models.ExpressionWrapper(models.F("data"), output_field=models.BinaryField())
        row = _snapshots().filter(run_id=run, seq=seq).values_list(raw, flat=True).first()
        if row is None or bytes(row[:1]) != GROUP:
            raise ValueError(
                f"a grouped value refers to snapshot {seq} of run {run}, which is gone"
            )
        holder = bytes(row)
    if holder[1:_LOCATOR] != key:
        raise zlib.error("a group's holder names another row")
    text = _decompress(holder[GROUP_HEADER:])
    if zlib.crc32(text) != crc or len(text) != size:
        raise zlib.error("a grouped value doesn't match the group it refers to")
    _keep_group(key, (crc, text))
    return text


def forget_groups() -> None:
    """Empty this process's group texts (as in another process: tests)."""
    global _GROUPS_BYTES
    with _GROUPS_LOCK:
        _GROUPS.clear()
        _GROUPS_BYTES = 0


def _sliced(blob: bytes, groups: Groups | None = None) -> bytes:
    """The text of a grouped value (a holder's or a member's)."""
    if len(blob) < GROUP_HEADER:
        raise zlib.error("a grouped value is truncated")
    crc, size, start, end = _GROUP_HEAD.unpack_from(blob, _LOCATOR)
    if not start <= end <= size:
        raise zlib.error("a grouped value lies outside its group")
    text = _group_text(blob[1:_LOCATOR], crc, size, blob if blob[:1] == GROUP else None, groups)
    return text[start:end]


def is_grouped(blob: bytes) -> bool:
    return blob[:1] in (GROUP, SLICE)


def inflate(
    blob: bytes, zdicts: dict[bytes, bytes] | None = None, groups: Groups | None = None
) -> bytes:
    """The JSON text (UTF-8) of a compressed column's stored bytes; `zdicts` and
    `groups`: dictionaries and group texts at hand (else from memory or the database)."""
    if type(blob) is not bytes:
        blob = bytes(blob)
    window = _WINDOWS.get(blob[:1])
    if window is None:
        return _sliced(blob, groups) if blob[:1] in (GROUP, SLICE) else _decompress(blob)
    key = blob[1:_LOCATOR]
    zdict = (zdicts or _TAILS).get(key)
    text = None if zdict is None else _unpack(blob, zdict, window)
    if text is None:
        # Not at hand, or remembered from a run since deleted: read it (again).
        forget_dictionary(key)
        zdict = dictionaries({key}).get(key)
        if zdict is None:
            run, seq = uuid.UUID(bytes=key[:16]), int.from_bytes(key[16:], "big")
            raise ValueError(f"a packed value refers to snapshot {seq} of run {run}, which is gone")
        text = _unpack(blob, zdict, window)
        if text is None:
            raise zlib.error("a packed value doesn't match the snapshot it refers to")
    return text


class Inflater:
    """inflate() for the values a replay reads in order, many packed against the same
    keyframe: zlib checks a dictionary's checksum each time one is set, which costs as
    much as inflating a delta; here it is set once per dictionary and the primed stream
    copied for each value. Anything else goes to inflate()."""

    def __init__(self) -> None:
        self.zdicts: dict[bytes, bytes] = {}
        self._primed: dict[bytes, Any] = {}

    def keyframe(self, run_id: Any, seq: int, text: bytes) -> None:
        """The text of snapshot `seq` of `run_id`, just read: the values after it may be
        packed against it."""
        self.zdicts[_key(run_id, seq)] = text[-FULL_WINDOW:]
        remember_dictionary(run_id, seq, text)

    def __call__(self, blob: Any) -> bytes:
        if type(blob) is not bytes:
            blob = bytes(blob)
        window = _WINDOWS.get(blob[:1])
        if window is None:  # not packed: a plain zlib stream, or a grouped value
            return _sliced(blob) if blob[:1] in (GROUP, SLICE) else _decompress(blob)
        zdict = self.zdicts.get(blob[1:_LOCATOR])
        # A zlib header with a preset dictionary: 2 bytes and the dictionary's checksum.
        head = blob[_LOCATOR : _LOCATOR + 6]
        if window is None or zdict is None or len(head) < 6 or not head[1] & 0x20:
            return inflate(blob, self.zdicts)
        key = blob[: _LOCATOR + 6]  # mark (window), locator and header
        primed = self._primed.get(key)
        try:
            if primed is None:
                primed = zlib.decompressobj(zdict=zdict[-window:])
                if primed.decompress(head):
                    return inflate(blob, self.zdicts)
                self._primed[key] = primed
            z = primed.copy()
            text = z.decompress(blob[_LOCATOR + 6 :])
        except zlib.error:
            return inflate(blob, self.zdicts)  # not that dictionary: inflate finds it
        if not z.eof:
            raise zlib.error("a packed value is truncated")
        return text


def inflate_many(blobs: list[bytes]) -> list[bytes]:
    """inflate() for many values: the dictionaries of packed ones and the groups of
    regrouped ones in one query per run."""
    blobs = [b if type(b) is bytes else bytes(b) for b in blobs]
    zdicts = dictionaries({b[1:_LOCATOR] for b in blobs if b[:1] in _WINDOWS})
    groups = groups_of(blobs)
    return [inflate(b, zdicts, groups) for b in blobs]
