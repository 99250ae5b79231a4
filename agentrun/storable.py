"""What the database can store: the one check for text arriving at any entry point."""

from __future__ import annotations

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
