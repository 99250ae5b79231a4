"""What the database can store: the one check for text arriving at any entry point."""

from __future__ import annotations

import json
import math
from typing import Any

#: The rule as a JSON Schema pattern, for API documents: no NUL. (A lone surrogate is
#: no Unicode at all: JSON Schema's strings can't hold one, so no pattern can name it.)
TEXT_PATTERN = r"^[^\u0000]*$"


def check_storable(value: Any, path: str = "$") -> None:
    """Refuse strings the database can't store (PostgreSQL has no NUL in text or jsonb,
    and UTF-8 has no lone surrogates). Raises ValueError naming the path."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:  # iterative: deep input must not overflow the stack
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError(
                    f"{where} contains a NUL character (\\u0000), which can't be stored"
                )
            try:
                item.encode()
            except UnicodeEncodeError:
                raise ValueError(f"{where} is not valid unicode (a lone surrogate)") from None
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, where))
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:50]}")
    return value


def _integer(text: str) -> int:
    if len(text) > 100:
        raise ValueError(f"integer too long ({len(text)} digits)")
    return int(text)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_json(raw: str | bytes) -> Any:
    """Strict JSON: no NaN/Infinity, nothing the database would refuse. Raises ValueError."""
    try:
        value = json.loads(
            raw, parse_float=_finite, parse_int=_integer, parse_constant=_no_constants
        )
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError, and what the hooks above raise
        raise ValueError(f"not valid JSON: {exc}") from None
    check_storable(value)
    return value
