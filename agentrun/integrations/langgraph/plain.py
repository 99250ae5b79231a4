"""LangGraph's values as plain JSON, for the debugger's pages and diffs.

A checkpoint holds whatever the graph's channels hold: LangChain messages, pydantic
models, dataclasses, bytes, sets. The saver keeps them as LangGraph's serializer wrote
them (the exact values); the snapshots get these plain versions, which read well in a
diff and which agentrun's delta store can store: a message becomes its fields (empty ones
left out), a model or dataclass its fields, a set or tuple a list, bytes base64 text,
anything else its repr.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import math
import uuid
from collections.abc import Mapping
from typing import Any

# A value nested deeper than this is shown as its repr (a cycle would be endless).
MAX_DEPTH = 64


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-able data: dicts with string keys, lists, strings, numbers."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if depth > MAX_DEPTH:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        items = [plain(v, depth + 1) for v in value]
        return sorted(items, key=repr)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal | datetime.timedelta):
        return str(value)
    if isinstance(value, enum.Enum):
        return plain(value.value, depth + 1)
    fields = _fields(value)
    if fields is not None:
        return {k: plain(v, depth + 1) for k, v in fields.items() if not _empty(v)}
    return repr(value)


def _fields(value: Any) -> dict[str, Any] | None:
    """A model's or a dataclass's fields (a LangChain message is a pydantic model)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dict(dump())
        except Exception:  # a model that can't dump itself is shown as its repr
            return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, dict | list | str) and not value)
