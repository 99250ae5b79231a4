"""Deep and unstorable JSON for the tests of the one JSON policy."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from tests.base import calls, final, script


def nest(levels: int, leaf: Any = "bottom") -> Any:
    """`levels` objects, each inside the one before: nest(2) == {"a": {"a": leaf}}."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def depth_of(value: Any) -> int:
    """How many objects and arrays deep `value` nests (a scalar: 0)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def limit() -> int:
    return settings.AGENTRUN_JSON_MAX_DEPTH


def scripted_input(depth: int) -> dict[str, Any]:
    """A `scripted` run's input nesting exactly `depth` levels: one echo call whose
    arguments are nested to make up the rest."""
    shell = script(calls({"tool": "echo", "args": {}}), final())
    extra = depth - depth_of(shell)
    shell["steps"][0]["calls"][0]["args"] = nest(extra + 1)
    assert depth_of(shell) == depth
    return shell
