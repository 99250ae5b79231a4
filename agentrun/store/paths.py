"""Paths into a state, and the index of the paths each stored change touched.

A path is a JSON pointer (`/memory/notes/cart`) or a dotted path (`memory.notes.cart`,
`messages.3.content`, `messages[3]`, `notes["a b"]`); a number is a list index, or the key
with those digits in an object. Each snapshot records the paths its change touched
(`touched_paths`, in `Snapshot.paths`, cut to `INDEX_DEPTH` keys), so a watch of one value
reads only the snapshots that may have changed it (`agentrun.store.watch`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

MAX_PATH_CHARS = 1000
MAX_PATH_DEPTH = 64
#: Keys of an op's path kept in the index; deeper changes are recorded at this depth.
INDEX_DEPTH = 4

Path = tuple[str | int, ...]


class _Missing:
    """No value at the path (the key or index does not exist)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class PathSyntaxError(ValueError):
    """The text is not a path; the message says where."""


# --- paths ---------------------------------------------------------------------

_INDEX = re.compile(r"-?(?:0|[1-9][0-9]*)")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE = re.compile(r"[^.\[\]\"'\s]+")
_BRACKET = re.compile(r"\[\s*(?:(-?[0-9]+)|(\"(?:[^\"\\]|\\.)*\")|'((?:[^'\\]|\\.)*)')\s*\]")


def parse_path(text: Any) -> Path:
    """The path named by `text`; PathSyntaxError when it is not one."""
    if not isinstance(text, str):
        raise PathSyntaxError("the path must be text")
    if len(text) > MAX_PATH_CHARS:
        raise PathSyntaxError(
            f"the path is {len(text):,} characters long; at most {MAX_PATH_CHARS:,}"
        )
    if "\x00" in text:
        raise PathSyntaxError("the path holds a NUL character")
    text = text.strip()
    if not text or text in ("$", "/"):
        raise PathSyntaxError(
            "give the path of a value inside the state, e.g. memory.notes.cart or /memory/notes/cart"
        )
    path = _parse_pointer(text) if text.startswith("/") else _parse_dotted(text)
    if len(path) > MAX_PATH_DEPTH:
        raise PathSyntaxError(f"the path is {len(path)} keys deep; at most {MAX_PATH_DEPTH}")
    return path


def _number_or_key(token: str) -> str | int:
    return int(token) if _INDEX.fullmatch(token) and not token.startswith("-") else token


def _parse_pointer(text: str) -> Path:
    out: list[str | int] = []
    for raw in text[1:].split("/"):
        if re.search(r"~[^01]|~$", raw):
            raise PathSyntaxError(f"bad escape in {raw!r}: in a JSON pointer ~ is written ~0, / ~1")
        out.append(_number_or_key(raw.replace("~1", "/").replace("~0", "~")))
    return tuple(out)


def _parse_dotted(text: str) -> Path:
    out: list[str | int] = []
    pos = 0
    if text.startswith("$"):
        pos = 1
        if len(text) > 1 and text[1] not in ".[":
            raise PathSyntaxError(f"bad path at {text[:20]!r}")
    need_key = pos == 0  # at the start a bare key needs no dot
    while pos < len(text):
        ch = text[pos]
        if ch == "[":
            m = _BRACKET.match(text, pos)
            if not m:
                raise PathSyntaxError(
                    f"bad path at {text[pos : pos + 20]!r}: a bracket holds an index or a quoted key"
                )
            number, dquoted, squoted = m.groups()
            if number is not None:
                out.append(int(number))
            elif dquoted is not None:
                try:
                    out.append(json.loads(dquoted))
                except ValueError:
                    raise PathSyntaxError(f"bad quoted key {dquoted[:20]!r}") from None
            else:
                out.append(re.sub(r"\\(.)", r"\1", squoted))
            pos = m.end()
            need_key = False
            continue
        if ch == ".":
            pos += 1
        elif not need_key:
            raise PathSyntaxError(f"bad path at {text[pos : pos + 20]!r}: expected . or [")
        m = _BARE.match(text, pos)
        if not m:
            raise PathSyntaxError(f"bad path at {text[pos : pos + 20]!r}: expected a key")
        out.append(_number_or_key(m.group(0)))
        pos = m.end()
        need_key = False
    if not out:
        raise PathSyntaxError("give the path of a value inside the state")
    return tuple(out)


def format_path(path: Sequence[str | int]) -> str:
    """memory.notes.cart, messages[3].content, notes["a b"]: the dotted form of a path."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += f"[{step}]"
        elif _IDENT.fullmatch(step):
            out += f".{step}" if out else step
        else:
            out += "[" + json.dumps(step, ensure_ascii=False) + "]"
    return out


def pointer(path: Sequence[str | int]) -> str:
    """The JSON pointer of a path (/memory/notes/cart)."""
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in path)


def resolve(value: Any, path: Sequence[str | int]) -> Any:
    """The value at path, or MISSING. A number is an index in a list, a key in an object."""
    for step in path:
        if type(value) is dict:
            key = step if type(step) is str else str(step)
            if key not in value:
                return MISSING
            value = value[key]
        elif type(value) is list and type(step) is int and -len(value) <= step < len(value):
            value = value[step]
        else:
            return MISSING
    return value


# --- the index of touched paths ------------------------------------------------------


def _token(step: Any) -> str:
    # List indexes shift, and a number in a watched path may be a key or an index:
    # every number (and every all-digit key) is the same token.
    if type(step) is int:
        return "#"
    if type(step) is str:
        # (A state's keys are few and come back at every step: the short ones are kept.)
        return _key_token(step) if len(step) <= 64 else _uncached_key_token(step)
    return _escaped_token(str(step))


def _uncached_key_token(key: str) -> str:
    return "#" if _INDEX.fullmatch(key) else _escaped_token(key)


_key_token = lru_cache(maxsize=4096)(_uncached_key_token)


def _escaped_token(step: str) -> str:
    token = step.replace("~", "~0").replace("/", "~1").replace("\n", "~2")
    # A text column holds no NUL and no lone surrogate: both are written as escapes.
    token = token.replace("\x00", "~3")
    return token.encode("utf-8", "backslashreplace").decode("utf-8")


def _line(path: Iterable[Any]) -> str:
    return "$" + "".join("/" + _token(s) for s in path)


# A splice of a list above INDEX_DEPTH is recorded with how many digits its start has
# ("$/messages~e": a start of 1,000 to 9,999; "~a": 0), so a watch of messages[3] is not
# handed the appends to a long list: they start after item 3. A token never holds a "~"
# that a letter follows (a key's "~" is written "~0"). Rows written before the mark
# recorded the list's line alone, which every watch below it still reads.
_SPLICE_DIGITS = "abcdefghijk"


_MARK = re.compile(r"~[a-k]$")


def _digits(n: int) -> int:
    return min(len(str(n)) if n > 0 else 0, len(_SPLICE_DIGITS) - 1)


def _splice_mark(start: int) -> str:
    return "~" + _SPLICE_DIGITS[_digits(start)]


def touched_paths(ops: Iterable[Any]) -> str:
    """Snapshot.paths for a change made of `ops`: one line per touched path (cut at
    INDEX_DEPTH keys; a list's splices on one line, marked with the digits of the
    lowest start: a watch needs only whether one starts at or before its item), framed
    by newlines so a path matches as a whole line."""
    lines: set[str] = set()
    starts: dict[str, int] = {}
    for op in ops:
        path = op[1]
        if op[0] == "splice" and len(path) < INDEX_DEPTH and type(op[2]) is int and op[2] >= 0:
            line = _line(path)
            starts[line] = min(op[2], starts.get(line, op[2]))
        else:
            lines.add(_line(path[:INDEX_DEPTH]))
    lines.update(line + _splice_mark(start) for line, start in starts.items())
    return "\n" + "\n".join(sorted(lines)) + "\n"


def _unescaped(token: str) -> str:
    return token.replace("~1", "/").replace("~2", "\n").replace("~3", "\x00").replace("~0", "~")


def named_paths(paths: str | None) -> list[Path]:
    """The paths a Snapshot.paths index names, as a person would watch them: each cut
    before its first list position (the index keeps none), deepest first; the whole
    state's line is left out."""
    found: set[Path] = set()
    for line in (paths or "").split("\n"):
        if not line.startswith("$/"):
            continue
        tokens = _MARK.sub("", line)[2:].split("/")
        if "#" in tokens:
            tokens = tokens[: tokens.index("#")]
        if tokens:
            found.add(tuple(_unescaped(t) for t in tokens))
    return sorted(found, key=lambda p: (-len(p), p))


def may_change_whole(paths: str | None) -> bool:
    """Whether a snapshot whose Snapshot.paths is `paths` may hold an op on the whole
    state: its index has the whole state's line (set, or spliced), or it has no index
    (written before the column)."""
    return not paths or "\n$\n" in paths or "\n$~" in paths
