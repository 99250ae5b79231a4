"""A framework's own checkpoint, kept beside a step (`Step.checkpoint`) in its own format.

A framework whose checkpointer stores its runs in agentrun (LangGraph's, in
`agentrun.integrations.langgraph`) reads back exactly the bytes its serializer wrote: they
are not for people (the step's snapshots and decision are). They live in a compressed JSON
column of their own, away from the decision the pages read, with each byte string as a
JSON string of one character per byte (latin-1): zlib then finds the same repeats as in
the raw bytes, which base64's 3-byte groups would hide.

A list that grows by appending (a conversation's messages) would cost its whole length at
every step. Serialized as a msgpack array (LangGraph's serializer), its bytes are a header
(the count) followed by each item's bytes, so a value whose items start with the previous
value's items is stored as those new items' bytes only, naming the step that holds the
previous one (an extension). Every `CHAIN`th value of a channel is stored whole (a
keyframe), so reading one value reads at most `CHAIN` steps. A keyframe still names the
previous value, so a reader that has it (the whole history) decodes only the new items.

Blob forms, by their first element:
- `["empty"]`: the channel has no value at that version;
- `["full", kind, data, items]`: the serializer's bytes, whole (`items`: the array's count,
  or None when the bytes are no array);
- `["full", kind, data, items, base, base_items, offset]`: whole, and `data[offset:]` are
  the items after the `base_items` items of the value stored in step `base`;
- `["ext", kind, tail, items, base, base_items, keyframe]`: the value of step `base`
  (`base_items` items) followed by the items in `tail`; `keyframe` is the step of the
  chain's whole value.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

#: Extensions in a row before a channel's value is stored whole again: reading one value
#: reads at most this many steps' records; the whole history parses one whole value
#: every CHAIN steps.
CHAIN = 64


# A NUL can't be stored in text (PostgreSQL's, an archive's): byte 0 is this character.
_NUL = "\u0100"


def text(data: bytes) -> str:
    """Bytes as a storable string, one character per byte (its latin-1 one, but NUL's)."""
    return data.decode("latin-1").replace("\x00", _NUL)


def data(stored: str) -> bytes:
    """The bytes of `text`'s string."""
    return stored.replace(_NUL, "\x00").encode("latin-1")


def array(data: bytes) -> tuple[int, int] | None:
    """(count, header length) of a msgpack array's bytes, or None if they are no array."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def array_header(count: int) -> bytes:
    """The msgpack header of an array of `count` items."""
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def whole(kind: str, value: bytes) -> list[Any]:
    """A blob stored whole."""
    shape = array(value) if kind == "msgpack" else None
    return ["full", kind, text(value), shape[0] if shape else None]


def blob(
    kind: str, value: bytes, base: tuple[int, str, bytes, int, int] | None
) -> tuple[list[Any], int, int]:
    """How to store `value` (the serializer's `kind` and bytes), given the channel's previous
    value as (its step, kind, bytes, chain length, keyframe step) when known: an extension of
    it when its items start the new value's items. Returns the blob, the new chain length and
    the keyframe's step (the caller's own step when the blob is whole: pass it as -1)."""
    shape = array(value) if kind == "msgpack" else None
    if base is None or shape is None:
        return whole(kind, value), 0, -1
    number, base_kind, base_value, chain, keyframe = base
    base_shape = array(base_value) if base_kind == kind else None
    if base_shape is None or base_shape[0] > shape[0]:
        return whole(kind, value), 0, -1
    body = memoryview(value)[shape[1] :]
    base_body = memoryview(base_value)[base_shape[1] :]
    if body[: len(base_body)] != base_body:
        return whole(kind, value), 0, -1
    offset = shape[1] + len(base_body)
    if chain + 1 >= CHAIN:
        full = ["full", kind, text(value), shape[0], number, base_shape[0], offset]
        return full, 0, -1
    tail = text(value[offset:])
    return ["ext", kind, tail, shape[0], number, base_shape[0], keyframe], chain + 1, keyframe


def extends(stored: list[Any]) -> tuple[int, int] | None:
    """(the base's step, its item count) of a blob whose first items are the base value's."""
    if stored[0] == "ext" or (stored[0] == "full" and len(stored) > 4):
        return stored[4], stored[5]
    return None


def needs(stored: list[Any]) -> int | None:
    """The step a blob's reading starts from when it is an extension (its keyframe)."""
    return stored[6] if stored[0] == "ext" else None


def value_bytes(
    records: Mapping[int, Mapping[str, Any]], number: int, channel: str
) -> tuple[str, bytes] | None:
    """The serializer's (kind, bytes) of `channel` as stored in step `number`; `records`
    holds the steps' records, by number, back to the keyframe. None for an empty blob."""
    stored = records[number]["blobs"][channel]
    if stored[0] == "empty":
        return None
    if stored[0] == "full":
        return stored[1], data(stored[2])
    base = value_bytes(records, stored[4], channel)
    assert base is not None, "an extension's base holds a value"
    shape = array(base[1])
    assert shape is not None
    body = base[1][shape[1] :] + data(stored[2])
    return stored[1], array_header(stored[3]) + body


def moved_out(decision: dict[str, Any]) -> dict[str, Any] | None:
    """A step decision written before the record had a column of its own (migration 0023;
    an archive exported then): its `langgraph_serialized`, base64 text, is taken out of it
    (in place) and returned as the column's record, each value whole; the versions the step
    wrote stay in the decision (`langgraph.written`). None if it has none."""
    old = decision.pop("langgraph_serialized", None)
    if old is None:
        return None

    def moved(kind: str, text_b64: str) -> list[str]:
        return [kind, text(base64.b64decode(text_b64))]

    record: dict[str, Any] = {
        "writes": [
            [task, idx, channel, *moved(kind, value), path]
            for task, idx, channel, kind, value, path in old.get("writes", [])
        ]
    }
    if "checkpoint" in old:
        record["checkpoint"] = moved(*old["checkpoint"])
        record["metadata"] = moved(*old["metadata"])
        record["blob_at"] = old["blob_at"]
        record["blobs"] = {
            channel: ["empty"] if kind == "empty" else whole(kind, base64.b64decode(value))
            for channel, (kind, value) in old["blobs"].items()
        }
        decision.setdefault("langgraph", {})["written"] = old.get("written", {})
    return record
