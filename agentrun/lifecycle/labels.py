"""Run labels: free-form `key=value` pairs given when a run starts, for finding it again.

One policy for every entry (the API, `startrun --label`, the demo): a key is 1-63
letters, digits and `.`, `_`, `-`, `/`, starting and ending with a letter or digit;
a value is 1-200 characters of printable text without surrounding blanks; a run has
at most MAX_LABELS of them and each key once. Labels are stored in their own small
table (`RunLabel`), so the run list filters on them with an index on both SQLite and
PostgreSQL. They don't change after the start; a fork inherits its parent's and gets
`forked-from=<the parent's short id>`, a key reserved for that.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun.agents import InvalidInput

MAX_LABELS = 20
KEY_MAX_LENGTH = 63
VALUE_MAX_LENGTH = 200
#: Set on every fork: its parent's short id (the first 8 characters, as the pages show it).
FORKED_FROM = "forked-from"
RESERVED_KEYS = (FORKED_FROM,)

# The patterns are written for both Python and JSON Schema (ECMA) regexes: explicit
# classes, no \s; matched here with fullmatch (Python's $ also matches before a final
# newline).
_KEY_BODY = r"[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?"
#: Printable text: no control characters (newlines, tabs, NUL...), no space at either end.
_VALUE_BODY = r"[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]{0,198}[^\x00-\x20\x7f])?"
KEY_PATTERN = f"^{_KEY_BODY}$"
VALUE_PATTERN = f"^{_VALUE_BODY}$"
#: A list filter: key=value, or key alone (any value).
FILTER_PATTERN = f"^{_KEY_BODY}(?:={_VALUE_BODY})?$"
FILTER_MAX_LENGTH = KEY_MAX_LENGTH + 1 + VALUE_MAX_LENGTH
_KEY = re.compile(_KEY_BODY)
_VALUE = re.compile(_VALUE_BODY)


class InvalidLabels(InvalidInput):
    """Labels that break the rules; the message says which and why."""


def key_problem(key: Any) -> str:
    if not isinstance(key, str) or not key:
        return "a label key must be a non-empty string"
    if len(key) > KEY_MAX_LENGTH:
        return (
            f"label key {key[:80]!r} is {len(key)} characters long; the limit is {KEY_MAX_LENGTH}"
        )
    if not _KEY.fullmatch(key):
        return (
            f"label key {key[:80]!r} is not allowed: use letters, digits and . _ - /, "
            "starting and ending with a letter or digit"
        )
    return ""


def value_problem(key: str, value: Any) -> str:
    if not isinstance(value, str):
        return f"label {key}: the value must be a string"
    if not value:
        return f"label {key}: the value is empty (write {key}=yes for a flag)"
    if len(value) > VALUE_MAX_LENGTH:
        return f"label {key}: the value is {len(value)} characters long; the limit is {VALUE_MAX_LENGTH}"
    try:
        value.encode()
    except UnicodeEncodeError:
        return f"label {key}: the value is not valid text (a lone surrogate)"
    if not _VALUE.fullmatch(value):
        return (
            f"label {key}: the value {value[:80]!r} has a control character (a newline, tab...) "
            "or a space at either end"
        )
    return ""


def check(labels: Any) -> dict[str, str]:
    """A run's labels as a JSON object, checked; raises InvalidLabels."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidLabels('labels must be an object of "key": "value" pairs')
    return _checked(labels.items())


def parse(items: Iterable[str]) -> dict[str, str]:
    """Labels written `key=value` (the command line), checked; raises InvalidLabels."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidLabels(f"label {item[:80]!r} has no '=': write key=value")
        pairs.append((key, value))
    return _checked(pairs)


def _checked(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in pairs:
        problem = key_problem(key) or value_problem(key, value)
        if problem:
            raise InvalidLabels(problem)
        if key in RESERVED_KEYS:
            raise InvalidLabels(f"label key {key!r} is reserved: agentrun sets it on forks")
        if key in out:
            raise InvalidLabels(f"label {key} is given twice; a run has each key once")
        out[key] = value
    if len(out) > MAX_LABELS:
        raise InvalidLabels(f"{len(out)} labels; a run has at most {MAX_LABELS}")
    return out


def parse_filter(text: str) -> tuple[str, str | None]:
    """A list filter: `key=value`, or `key` alone for any value; raises InvalidLabels."""
    key, sep, value = text.partition("=")
    problem = key_problem(key) or (value_problem(key, value) if sep else "")
    if problem:
        raise InvalidLabels(problem)
    return key, (value if sep else None)


def for_fork(parent_labels: Mapping[str, str], parent_id: Any) -> dict[str, str]:
    """A fork's labels: its parent's, with forked-from naming the parent."""
    return {**parent_labels, FORKED_FROM: str(parent_id)[:8]}


def format_label(key: str, value: str) -> str:
    return f"{key}={value}"


def store(run: Any, labels: Mapping[str, str]) -> None:
    """Write a new run's (checked) labels."""
    from agentrun.models import RunLabel

    RunLabel.objects.bulk_create(
        [RunLabel(run=run, key=key, value=value) for key, value in sorted(labels.items())]
    )


def of(run: Any) -> dict[str, str]:
    """A run's labels, sorted by key; from its prefetched labels when there are."""
    return {label.key: label.value for label in sorted(run.labels.all(), key=lambda x: x.key)}


def filter_runs(runs: Any, filters: Iterable[str]) -> Any:
    """`runs` narrowed to those with every label of `filters`: `key=value`, or a bare word
    that is a label's key (any value) or a label's value (any key); raises InvalidLabels on
    a filter that is no label."""
    from django.db.models import Q

    from agentrun.models import RunLabel

    for text in filters:
        key, value = parse_filter(text)
        if value is None:
            having = RunLabel.objects.filter(Q(key=key) | Q(value=key))
        else:
            having = RunLabel.objects.filter(key=key, value=value)
        runs = runs.filter(pk__in=having.values("run_id"))
    return runs
