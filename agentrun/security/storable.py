"""What the database can store and the engine can execute: one policy for JSON at every entry.

A JSON value arriving from outside passes one of two doors:

- from a person (the API, the forms, the commands): `check_storable` refuses it,
  naming the path, when it nests deeper than the limit, is too large, or holds
  text the database can't store (PostgreSQL has no NUL in text or jsonb, UTF-8
  has no lone surrogates). The person can fix it and send it again.
- from a model or a tool (a decision, a tool's result or error, an exception's
  message): nobody can be asked again without spending tokens or repeating a
  side effect, so text is kept, escaped losslessly once where it arrives
  (`escape`, `escape_text`), and only depth and size are refused
  (`shape_problem`), which fails the step with that message.

Limits: a value that goes into a state (run input, tool arguments and results, a
model's reply) nests at most `AGENTRUN_JSON_MAX_DEPTH` levels; a whole state
(a fork's edited state, the state a step leaves) may nest `STATE_ROOM` more, for
the state's own structure around such values. Every walk here is iterative, and
the engine's recursive code (hashing, deltas, redaction, the pages' JSON trees)
stays far below Python's recursion limit at these depths.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.conf import settings

from agentrun.security.redact import REDACTED, hides_nothing, is_secret_key, redact_text

#: The rule as a JSON Schema pattern, for API documents: no NUL. (A lone surrogate is
#: no Unicode at all: JSON Schema's strings can't hold one, so no pattern can name it.)
TEXT_PATTERN = r"^[^\u0000]*$"

# Levels a state adds around the values stored in it (history[i].tool_calls[j]...).
STATE_ROOM = 20

# Escaped text: U+241B (SYMBOL FOR ESCAPE, shown as "␛") + "u" + four hex digits, for
# each NUL, lone surrogate and U+241B itself, so that unescape_text gives back exactly
# what the model or tool sent, and the escape is visible wherever the text is shown.
ESCAPE = "\u241b"
_UNSTORABLE = re.compile("[\x00\u241b\ud800-\udfff]")
_ESCAPED = re.compile("\u241bu([0-9a-f]{4})")


def max_depth(*, state: bool = False) -> int:
    depth: int = settings.AGENTRUN_JSON_MAX_DEPTH
    return depth + STATE_ROOM if state else depth


def escape_text(text: str) -> str:
    """`text` with what the database can't hold escaped losslessly (see ESCAPE)."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub(lambda m: f"{ESCAPE}u{ord(m.group()):04x}", text)


def escape(value: Any) -> Any:
    """`value` with escape_text applied to every string and key (a copy of its lists and
    objects). Apply it once, where text arrives from a model or a tool: escaping what is
    already escaped escapes it again, which is what makes it lossless. Recursive: call it
    on values whose depth shape_problem has checked."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {(escape_text(k) if isinstance(k, str) else k): escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [escape(v) for v in value]
    return value


def escape_redacted(value: Any) -> Any:
    """redact(escape(value)) in one walk: how a step keeps a decision or a tool's result,
    its text escaped (see escape) and then its secrets redacted (see agentrun.security.redact).
    Always a copy of its lists and objects, tuples made lists. Recursive, as escape."""
    if isinstance(value, str):
        return redact_text(escape_text(value))
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str):
                key = escape_text(key)
                if is_secret_key(key):
                    # What hides nothing (None, "", a boolean, REDACTED) escapes as itself.
                    out[key] = item if hides_nothing(item) else REDACTED
                    continue
            out[key] = escape_redacted(item)
        return out
    if isinstance(value, list | tuple):
        return [escape_redacted(v) for v in value]
    return value


def unescape_text(text: str) -> str:
    """The text as it was sent, from its escaped form."""
    if ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), text)


def _text_problem(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where} contains a NUL character (\\u0000), which can't be stored"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return f"{where} is not valid unicode (a lone surrogate)"
    return None


def _short(where: str) -> str:
    return where if len(where) <= 80 else f"{where[:40]}…{where[-30:]}"


def shape_problem(
    value: Any, *, depth: int | None = None, text: bool = False, what: str = "$"
) -> str | None:
    """Why `value` can't be stored and executed, or None.

    Checks nesting (at most `depth` levels, the policy's limit by default) and,
    with `text`, strings the database can't store (keys included).
    """
    limit = max_depth() if depth is None else depth
    stack: list[tuple[Any, str, int]] = [(value, what, 0)]
    while stack:  # iterative: deep input must not overflow the stack
        item, where, level = stack.pop()
        if isinstance(item, dict | list):
            if level >= limit:
                return (
                    f"{_short(where)} nests deeper than {limit} levels, the limit "
                    "(AGENTRUN_JSON_MAX_DEPTH)"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if text and isinstance(key, str):
                        problem = _text_problem(key, f"a key in {_short(where)}")
                        if problem:
                            return problem
                    stack.append((child, f"{where}.{key}", level + 1))
            else:
                stack.extend((child, f"{where}[{i}]", level + 1) for i, child in enumerate(item))
        elif text and isinstance(item, str):
            problem = _text_problem(item, _short(where))
            if problem:
                return problem
    return None


def size_problem(value: Any, limit: int, what: str = "the value") -> str | None:
    """Why `value` is not JSON or too large, or None (call after shape_problem: this recurses)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a set, a datetime, NaN...
        return f"{what} is not JSON: {exc}"
    size = len(text.encode("utf-8", "replace"))
    if size > limit:
        return f"{what} is {size} bytes of JSON; the limit is {limit} (AGENTRUN_JSON_MAX_BYTES)"
    return None


# Most values a step stores are far within every limit. One walk, with no path kept, says
# so: their nesting, text (when asked) and an upper bound of their JSON's size. Only a
# value it can't clear is walked again by shape_problem and encoded by size_problem, which
# say what is wrong, if anything. (A step checks its decision and its tool's result.)
_SHORT_INT = 10**15  # at most 17 characters of JSON
_NUMBER_BYTES = 32  # a finite float's repr is at most 24
_UNSTORABLE_TEXT = re.compile("[\x00\ud800-\udfff]")


def _clears(value: Any, limit: int, text: bool, max_bytes: float) -> bool:
    """Whether `value` surely has no problem: nests at most `limit` levels, is JSON,
    its JSON text is under `max_bytes` (counting 6 bytes a character, the \\u escape of
    a control character), and, with `text`, holds no text the database can't store.
    False: it may have one (a subclass, a number's key: look closer)."""
    size = 0
    stack: list[tuple[Any, int]] = [([value], -1)]  # (the value, as the item of a list)
    while stack:
        item, level = stack.pop()
        if level >= limit:
            return False
        size += 4  # brackets, and the separator before it
        if type(item) is dict:
            for key in item:
                if type(key) is not str or (text and _UNSTORABLE_TEXT.search(key)):
                    return False
                size += 6 * len(key) + 4
            children: Any = item.values()
        else:
            children = item
        for child in children:
            t = type(child)
            if t is str:
                if text and _UNSTORABLE_TEXT.search(child):
                    return False
                size += 6 * len(child) + 4
            elif t is int:
                if not -_SHORT_INT < child < _SHORT_INT:
                    return False
                size += _NUMBER_BYTES
            elif t is float:
                if not math.isfinite(child):
                    return False
                size += _NUMBER_BYTES
            elif child is None or t is bool:
                size += 7
            elif t is dict or t is list or t is tuple:  # (a tuple is a list in JSON)
                stack.append((child, level + 1))
            else:
                return False
        if size > max_bytes:
            return False
    return True


def clears(value: Any, *, depth: int | None = None, max_bytes: int | None = None) -> bool:
    """Whether `value` surely has none of problem()'s problems (text not checked): one
    quick walk; False means it may have one."""
    limit = max_depth() if depth is None else depth
    return _clears(value, limit, False, math.inf if max_bytes is None else max_bytes)


def problem(
    value: Any,
    *,
    depth: int | None = None,
    max_bytes: int | None = None,
    text: bool = False,
    what: str = "$",
    named: str | None = None,
) -> str | None:
    """shape_problem, then (with `max_bytes`) size_problem: why `value` can't be stored
    and executed, or None. `what`: the value's path in shape_problem's words, `named`:
    its name in size_problem's (default: `what`). A value far within the limits costs
    one quick walk."""
    limit = max_depth() if depth is None else depth
    if _clears(value, limit, text, math.inf if max_bytes is None else max_bytes):
        return None
    found = shape_problem(value, depth=limit, text=text, what=what)
    if found is None and max_bytes is not None:
        found = size_problem(value, max_bytes, named or what)
    return found


def check_storable(value: Any, path: str = "$", *, depth: int | None = None) -> None:
    """Refuse what a person sent that can't be stored or executed: too deep, or text
    the database can't hold. Raises ValueError naming the path.

    The depth defaults to what a request body may hold (a whole state, one level
    down); the services check each part against its own limit.
    """
    limit = max_depth(state=True) + 1 if depth is None else depth
    problem = shape_problem(value, depth=limit, text=True, what=path)
    if problem:
        raise ValueError(problem)


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
    raise ValueError(f"{name} is not allowed in JSON")


def loads(raw: str | bytes) -> Any:
    """JSON text's value, by the policy's number rules: no NaN or Infinity, no number
    out of a float's range (1e999), no integer of more than 100 digits. Raises
    json.JSONDecodeError (which says where), ValueError or RecursionError; parse_json
    is the door that also checks depth and text."""
    return json.loads(raw, parse_float=_finite, parse_int=_integer, parse_constant=_no_constants)


def parse_json(raw: str | bytes) -> Any:
    """Strict JSON: no NaN/Infinity, nothing the database would refuse. Raises ValueError."""
    try:
        value = loads(raw)
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError, and what the hooks above raise
        raise ValueError(f"not valid JSON: {exc}") from None
    check_storable(value)
    return value
