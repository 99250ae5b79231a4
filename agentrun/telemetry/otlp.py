"""OTLP's protobuf encoding of agentrun's spans, written from the values a step attempt left.

The OpenTelemetry SDK makes a span object per span (attribute checks, locks, a context) and
its exporter then builds a protobuf message per attribute: about 60 µs a span here, a tenth
of a CPU-bound step for its two spans. A span agentrun emits is known whole when it is
emitted (its attempt has ended), so it is encoded once, straight to the wire format, and
the batch is the concatenation of its spans' bytes under the process's resource and scope.
The SDK still decides sampling, reads the resource, batches, retries and posts; the tests
hold the bytes against the SDK's own encoder (`tests/telemetry/test_otlp.py`).

Field numbers: opentelemetry-proto, trace/v1/trace.proto and common/v1/common.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Span kinds as OTLP numbers them.
INTERNAL, SERVER, CLIENT = 1, 2, 3
#: Status codes.
UNSET, OK, ERROR = 0, 1, 2

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_INT64 = (1 << 64) - 1
# Span.flags: the parent's is-remote bit is known (and set when the parent is remote).
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]  # a varint under 128 is its own byte


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (`tag`: its number and wire type 2, one byte)."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 0x80 else _varint(n)) + payload


def _text(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode("utf-8", "replace"))


def _value(value: Any) -> bytes:
    """An AnyValue's fields."""
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & _INT64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):  # an ArrayValue of AnyValues
        return _field(b"\x2a", b"".join(_field(b"\x0a", _value(v)) for v in value))
    if isinstance(value, Mapping):  # a KeyValueList
        return _field(b"\x32", attributes(b"\x0a", {str(k): v for k, v in value.items()}))
    if value is None:
        return b""
    raise TypeError(f"an attribute can't be a {type(value).__name__}")


_KEYS: dict[str, bytes] = {}  # a KeyValue's key field, by key: a process uses a few dozen


def attributes(tag: bytes, values: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue fields (`tag`: the field's number and wire type 2, one byte)."""
    out = []
    for key, value in values.items():
        k = _KEYS.get(key)
        if k is None:
            k = _text(b"\x0a", key) if key else b""
            if len(_KEYS) < 1024:
                _KEYS[key] = k
        if value.__class__ is str:  # most are: inline
            raw = value.encode("utf-8", "replace")
            n = len(raw)
            v = b"\x0a" + (_SMALL[n] if n < 0x80 else _varint(n)) + raw
        else:
            v = _value(value)
        n = len(v)
        kv = k + b"\x12" + (_SMALL[n] if n < 0x80 else _varint(n)) + v
        n = len(kv)
        out.append(tag + (_SMALL[n] if n < 0x80 else _varint(n)) + kv)
    return b"".join(out)


def span(
    trace_id: int,
    span_id: int,
    parent_id: int,
    name: str,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any],
    *,
    kind: int = INTERNAL,
    remote_parent: bool = False,
    events: Iterable[tuple[str, int, Mapping[str, Any]]] = (),
    links: Iterable[tuple[int, int, Mapping[str, Any]]] = (),
    status: tuple[int, str] = (UNSET, ""),
) -> bytes:
    """One Span message: `events` are (name, time, attributes), `links` (trace id, span id,
    attributes) of remote spans, `status` (code, message); a `parent_id` of 0 is none."""
    parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08", span_id.to_bytes(8, "big")]
    if parent_id:
        parts += (b"\x22\x08", parent_id.to_bytes(8, "big"))
    # proto3 leaves out a scalar at its default (0, ""): so do we, byte for byte as the SDK.
    if name:
        parts.append(_text(b"\x2a", name))
    parts += (b"\x30", _varint(kind))
    if start_ns:
        parts += (b"\x39", _FIXED64(start_ns))
    if end_ns:
        parts += (b"\x41", _FIXED64(end_ns))
    parts.append(attributes(b"\x4a", attrs))
    for event_name, at, event_attrs in events:
        event = (b"\x09" + _FIXED64(at) if at else b"") + (
            _text(b"\x12", event_name) if event_name else b""
        )
        parts.append(_field(b"\x5a", event + attributes(b"\x1a", event_attrs)))
    for link_trace, link_span, link_attrs in links:
        link = b"\x0a\x10" + link_trace.to_bytes(16, "big") + b"\x12\x08"
        link += link_span.to_bytes(8, "big") + attributes(b"\x22", link_attrs)
        parts.append(_field(b"\x6a", link + b"\x35" + _FIXED32(_HAS_IS_REMOTE | _IS_REMOTE)))
    code, message = status
    parts.append(_field(b"\x7a", (_text(b"\x12", message) if message else b"") + (
        b"\x18" + _varint(code) if code else b""
    )))  # fmt: skip
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if parent_id and remote_parent else 0)
    parts += (b"\x85\x01", _FIXED32(flags))
    return b"".join(parts)


def prefix(resource: Mapping[str, Any], scope: str) -> tuple[bytes, bytes]:
    """What every request of a process starts with: its Resource field and its scope's
    InstrumentationScope field, encoded once."""
    return _field(b"\x0a", attributes(b"\x0a", resource)), _field(b"\x0a", _text(b"\x0a", scope))


def request(resource: bytes, scope: bytes, spans: Iterable[bytes]) -> bytes:
    """An ExportTraceServiceRequest: one ResourceSpans with one ScopeSpans of `spans`."""
    scope_spans = scope + b"".join(_field(b"\x12", s) for s in spans)
    return _field(b"\x0a", resource + _field(b"\x12", scope_spans))
