"""Readable diffs between two agent states.

`agentrun.store.delta.diff` finds what differs in well under a millisecond, even
between two 2.5 MB states; deepdiff then explains only those subtrees
(a changed message, the replaced part of a list), never the whole state.
The result is a flat list of changes with old → new values, long strings
as an inline text diff and list appends as appended items, plus a summary
line such as "3 added, 1 changed in memory.notes".
"""

from __future__ import annotations

import difflib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from uuid import UUID

from deepdiff import DeepDiff

from agentrun.store import delta
from debugger.jsontree import Path, format_path, json_size, json_type

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()
PREVIEW_CHARS = 240
FULL_CHARS = 20_000
TEXT_DIFF_MIN = 60  # strings at least this long (or multi-line) get an inline text diff
TEXT_DIFF_MAX = 100_000
CONTEXT_CHARS = 80
GROUP_OPEN_MAX = 10  # a group of more changes starts collapsed (unless the whole diff is small)
SHOWN_MAX = 500  # changes rendered on a page; the rest are counted

_ADDED = {"dictionary_item_added", "iterable_item_added", "attribute_added", "set_item_added"}
_REMOVED = {
    "dictionary_item_removed",
    "iterable_item_removed",
    "attribute_removed",
    "set_item_removed",
}


@dataclass
class Change:
    """One difference. `op` is added | removed | changed | appended | inserted | dropped.

    What a template shows (previews, the text diff) is worked out once per change.
    """

    op: str
    path: Path
    old: Any = MISSING
    new: Any = MISSING
    items: list[Any] = field(default_factory=list)  # appended / inserted / dropped items
    index: int = 0  # where those items start

    @property
    def path_text(self) -> str:
        return format_path(self.path) or "$"

    @property
    def count(self) -> int:
        return len(self.items) if self.op in ("appended", "inserted", "dropped") else 1

    @cached_property
    def old_preview(self) -> Preview | None:
        return None if self.old is MISSING else Preview.of(self.old)

    @cached_property
    def new_preview(self) -> Preview | None:
        return None if self.new is MISSING else Preview.of(self.new)

    @cached_property
    def item_previews(self) -> list[tuple[int, Preview]]:
        return [(self.index + i, Preview.of(item)) for i, item in enumerate(self.items[:50])]

    @property
    def more_items(self) -> int:
        return max(0, len(self.items) - 50)

    @cached_property
    def text_diff(self) -> list[tuple[str, str]] | None:
        if not (self.op == "changed" and isinstance(self.old, str) and isinstance(self.new, str)):
            return None
        if max(len(self.old), len(self.new)) >= TEXT_DIFF_MIN or "\n" in self.old + self.new:
            return text_diff(self.old, self.new)
        return None

    @property
    def type_changed(self) -> bool:
        return self.op == "changed" and json_type(self.old) != json_type(self.new)


@dataclass
class Preview:
    """A value shortened for display; `full` is set when the short form is cut."""

    kind: str
    short: str
    full: str | None
    size: int

    @classmethod
    def of(cls, value: Any) -> Preview:
        text = json.dumps(value, ensure_ascii=False, default=str)
        full = None
        if len(text) > PREVIEW_CHARS:
            pretty = (
                value
                if isinstance(value, str)
                else json.dumps(value, ensure_ascii=False, indent=2, default=str)
            )
            full = pretty[:FULL_CHARS] + ("\n… (truncated)" if len(pretty) > FULL_CHARS else "")
            text = text[:PREVIEW_CHARS] + "…"
        return cls(json_type(value), text, full, json_size(value))


def _counts(changes: Iterable[Change]) -> dict[str, int]:
    counts = {"added": 0, "removed": 0, "changed": 0}
    for c in changes:
        if c.op in ("added", "appended", "inserted"):
            counts["added"] += c.count
        elif c.op in ("removed", "dropped"):
            counts["removed"] += c.count
        else:
            counts["changed"] += 1
    return counts


_SIGNS = {"added": "+", "removed": "−", "changed": "~"}
_LIST_OPS = {"appended", "inserted", "dropped"}


def _kind_of(c: Change) -> str:
    if c.op in ("added", "appended", "inserted"):
        return "added"
    if c.op in ("removed", "dropped"):
        return "removed"
    return "changed"


def _unit(c: Change) -> str:
    """What one count of a change is: list items, keys of an object, or values."""
    if c.op in _LIST_OPS or (
        c.op in ("added", "removed") and c.path and isinstance(c.path[-1], int)
    ):
        return "list item"
    if c.op in ("added", "removed"):
        return "key"
    return "value"


def _container(c: Change) -> Path:
    """Where the change happened: the list whose items came or went, the object whose key
    did, the value that changed."""
    return c.path if c.op in _LIST_OPS or c.op == "changed" else c.path[:-1]


def _common(paths: list[Path]) -> Path:
    prefix = list(paths[0]) if paths else []
    for p in paths[1:]:
        n = 0
        while n < min(len(prefix), len(p)) and prefix[n] == p[n]:
            n += 1
        del prefix[n:]
    return prefix


@dataclass
class CountChip:
    """One count of a group, worded so it says what was counted and where:
    "−3 list items in tool_calls[2]", not "−3 removed"."""

    label: str  # added | removed | changed
    n: int
    unit: str  # "list item", "key", "value", or "" when several kinds are counted together
    where: str  # the deepest path holding all of them, when deeper than the group's key

    @property
    def text(self) -> str:
        unit = f" {self.unit}{'s' if self.n != 1 else ''}" if self.unit else f" {self.label}"
        place = f" in {self.where}" if self.where else ""
        return f"{_SIGNS[self.label]}{self.n:,}{unit}{place}"

    @property
    def title(self) -> str:
        what = f"{self.unit}{'s' if self.n != 1 else ''}" if self.unit else "changes"
        place = f" inside {self.where}" if self.where else ""
        return f"{self.n:,} {what} {self.label}{place}"


def count_chips(changes: Sequence[Change], depth: int = 1) -> list[CountChip]:
    """The counts of `changes` by kind (added, removed, changed), each with its unit and the
    place that holds them all when it is more than `depth` keys deep."""
    chips = []
    for label in ("added", "removed", "changed"):
        mine = [c for c in changes if _kind_of(c) == label]
        if not mine:
            continue
        n = sum(c.count for c in mine) if label != "changed" else len(mine)
        units = {_unit(c) for c in mine}
        where = _common([_container(c) for c in mine])
        chips.append(
            CountChip(
                label,
                n,
                units.pop() if len(units) == 1 else "",
                format_path(where) if len(where) > depth else "",
            )
        )
    return chips


@dataclass
class ChangeGroup:
    """The changes under one top-level key of the state ("$": the state itself)."""

    key: str
    changes: list[Change]
    shown: list[Change]  # the ones the page has room for
    open: bool  # shown expanded at first

    @property
    def counts(self) -> dict[str, int]:
        return _counts(self.changes)

    @property
    def summary(self) -> str:
        return ", ".join(f"{n:,} {label}" for label, n in self.counts.items() if n)

    @property
    def chips(self) -> list[CountChip]:
        return count_chips(self.changes, depth=0 if self.key == "$" else 1)

    @property
    def hidden(self) -> int:
        return len(self.changes) - len(self.shown)

    @property
    def inside(self) -> str:
        """Where in the group the changes are, for a folded group: "notes +120, goal ~1"."""
        by_key: dict[str, list[Change]] = {}
        for c in self.changes:
            if len(c.path) > 1:
                by_key.setdefault(format_path(c.path[1:2]).lstrip("."), []).append(c)
        parts = []
        for key, changes in list(by_key.items())[:4]:
            counts = _counts(changes)
            signs = (("added", "+"), ("removed", "−"), ("changed", "~"))
            parts.append(f"{key} " + " ".join(f"{m}{counts[k]:,}" for k, m in signs if counts[k]))
        more = len(by_key) - len(parts)
        return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


@dataclass
class StateDiff:
    changes: list[Change]
    old_size: int = 0
    new_size: int = 0

    @property
    def identical(self) -> bool:
        return not self.changes

    @property
    def counts(self) -> dict[str, int]:
        return _counts(self.changes)

    @cached_property
    def groups(self) -> list[ChangeGroup]:
        """The changes by top-level key, in the order they come; at most SHOWN_MAX shown.

        A group starts collapsed when it is big and the diff is not small.
        """
        by_key: dict[str, list[Change]] = {}
        for c in self.changes:
            by_key.setdefault(str(c.path[0]) if c.path else "$", []).append(c)
        small = len(self.changes) <= GROUP_OPEN_MAX * 2
        budget = SHOWN_MAX
        groups = []
        for key, changes in by_key.items():
            shown = changes[: max(budget, 0)]
            budget -= len(shown)
            groups.append(ChangeGroup(key, changes, shown, small or len(changes) <= GROUP_OPEN_MAX))
        return groups

    @property
    def hidden(self) -> int:
        """Changes beyond SHOWN_MAX, left off the page."""
        return max(0, len(self.changes) - SHOWN_MAX)

    @property
    def where(self) -> str:
        paths = [c.path for c in self.changes]
        if not paths:
            return ""
        prefix = list(paths[0])
        for p in paths[1:]:
            n = 0
            while n < min(len(prefix), len(p)) and prefix[n] == p[n]:
                n += 1
            del prefix[n:]
        # A single changed leaf is named by its own path; say where it lives instead.
        if (
            len(paths) == 1
            and prefix == list(paths[0])
            and self.changes[0].op in ("added", "removed", "changed")
        ):
            prefix = prefix[:-1]
        if prefix:
            return "in " + format_path(prefix)
        tops = sorted({str(p[0]) for p in paths if p})
        shown = ", ".join(tops[:4]) + (f" and {len(tops) - 4} more" if len(tops) > 4 else "")
        return f"across {shown}" if tops else ""

    @property
    def summary(self) -> str:
        if self.identical:
            return "identical"
        parts = [f"{n:,} {label}" for label, n in self.counts.items() if n]
        return ", ".join(parts) + (f" {self.where}" if self.where else "")

    @property
    def size_change(self) -> int:
        return self.new_size - self.old_size


# --- computing the diff -----------------------------------------------------------


def diff_states(
    old: Any, new: Any, old_size: int | None = None, new_size: int | None = None
) -> StateDiff:
    """All differences from old to new, deepdiff only on the subtrees that differ.

    Pass the sizes when they are known (Snapshot.size): measuring a big state costs more
    than diffing it.
    """
    changes: list[Change] = []
    shift: dict[Path, int] = defaultdict(int)  # per list (new coords): inserted - dropped so far

    def old_path(path: Sequence[str | int]) -> Path:
        out: list[str | int] = []
        for i, step in enumerate(path):
            if isinstance(step, int):
                step = step - shift.get(tuple(path[:i]), 0)
            out.append(step)
        return tuple(out)

    for op in delta.diff(old, new):
        name, path = op[0], tuple(op[1])
        if name == "del":
            changes.append(Change("removed", path, old=_at(old, old_path(path))))
        elif name == "set":
            changes.extend(_set_changes(old, new, path, old_path))
        else:
            _, _, start, dropped, items = op
            changes.extend(_splice_changes(old, new, path, start, dropped, items, old_path))
            shift[path] += len(items) - dropped
    return StateDiff(
        changes,
        old_size=json_size(old) if old_size is None else old_size,
        new_size=json_size(new) if new_size is None else new_size,
    )


def _at(value: Any, path: Iterable[str | int]) -> Any:
    for step in path:
        value = value[step]
    return value


def _set_changes(old: Any, new: Any, path: Path, old_path: Any) -> list[Change]:
    new_value = _at(new, path)
    if path:
        parent = _at(old, old_path(path[:-1]))
        if isinstance(parent, dict) and path[-1] not in parent:
            return [Change("added", path, new=new_value)]
    old_value = _at(old, old_path(path))
    return _explain(path, old_value, new_value)


def _splice_changes(
    old: Any, new: Any, path: Path, start: int, dropped: int, items: list, old_path: Any
) -> list[Change]:
    old_list = _at(old, old_path(path))
    old_start = old_path((*path, start))[-1]  # where the splice starts in the old list
    removed = old_list[old_start : old_start + dropped]
    if not dropped:
        appended = old_start == len(old_list)
        return [
            Change("appended" if appended else "inserted", path, items=list(items), index=start)
        ]
    if not items:
        return [Change("dropped", path, items=list(removed), index=old_start)]
    # Part of the list was replaced: let deepdiff say how, item by item.
    return _deep(path, list(removed), list(items), index_offset=(start, old_start))


def _explain(path: Path, old_value: Any, new_value: Any) -> list[Change]:
    if isinstance(old_value, dict | list) and type(old_value) is type(new_value):
        return _deep(path, old_value, new_value)
    return [Change("changed", path, old=old_value, new=new_value)]


def _deep(
    path: Path, old_value: Any, new_value: Any, index_offset: tuple[int, int] | None = None
) -> list[Change]:
    """deepdiff over one small subtree pair, its paths rebased onto `path`."""
    tree = DeepDiff(old_value, new_value, view="tree", threshold_to_diff_deeper=0)

    def rebase(rel: list[Any], removed: bool = False) -> Path:
        if index_offset and rel and isinstance(rel[0], int):
            rel = [rel[0] + index_offset[1 if removed else 0], *rel[1:]]
        return (*path, *rel)

    added: list[tuple[list[Any], Any]] = []
    out: list[Change] = []
    for report, levels in tree.items():
        for level in levels:
            rel = level.path(output_format="list")
            if report in _ADDED:
                added.append((rel, level.t2))
            elif report in _REMOVED:
                out.append(Change("removed", rebase(rel, removed=True), old=level.t1))
            else:
                out.append(Change("changed", rebase(rel), old=level.t1, new=level.t2))
    out.extend(_group_appends(added, old_value, new_value, rebase))
    out.sort(key=lambda c: _sort_key(c.path))
    return out


def _group_appends(
    added: list[tuple[list[Any], Any]], old_value: Any, new_value: Any, rebase: Any
) -> list[Change]:
    """Items added at the end of a list become one "appended" change."""
    by_parent: dict[tuple[Any, ...], list[tuple[int, Any]]] = defaultdict(list)
    out: list[Change] = []
    for rel, value in added:
        if rel and isinstance(rel[-1], int):
            by_parent[tuple(rel[:-1])].append((rel[-1], value))
        else:
            out.append(Change("added", rebase(rel), new=value))
    for parent, entries in by_parent.items():
        entries.sort(key=lambda e: e[0])
        try:
            old_len = len(_at(old_value, parent))
            new_len = len(_at(new_value, parent))
        except (KeyError, IndexError, TypeError):
            old_len = new_len = -1
        indexes = [i for i, _ in entries]
        if indexes == list(range(old_len, new_len)) and old_len >= 0:
            base = rebase([*parent, old_len])
            out.append(Change("appended", base[:-1], items=[v for _, v in entries], index=base[-1]))
        else:
            out.extend(Change("added", rebase([*parent, i]), new=v) for i, v in entries)
    return out


def _sort_key(path: Path) -> tuple[tuple[int, Any], ...]:
    return tuple((0, p) if isinstance(p, int) else (1, p) for p in path)


# --- inline text diff -----------------------------------------------------------------

_WORDS = re.compile(r"\s+|\w+|[^\w\s]", re.UNICODE)
_SPACE = re.compile(r"\s")
TOKEN_CHARS = 40  # a replaced stretch this short without whitespace is a token (an id, a number)


def text_diff(a: str, b: str) -> list[tuple[str, str]]:
    """[(eq|del|ins|gap, text)]: prose by words, tokens by characters.

    Two short strings without whitespace (ids, numbers, paths) are compared character
    by character; anything else word by word, each replaced stretch shown whole as
    deleted then inserted text, so that "Gas canister, 230 stakes" becoming "Aluminium
    tent, stakes" reads as two phrases, not as interleaved words or letters. Long
    unchanged stretches are shortened with "…".
    """
    if _is_token(a) and _is_token(b):
        return _shorten(_by_chars(a, b))
    if len(a) + len(b) > TEXT_DIFF_MAX:
        ta, tb = a.splitlines(keepends=True), b.splitlines(keepends=True)
    else:
        ta, tb = _WORDS.findall(a), _WORDS.findall(b)
    parts: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, ta, tb, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        old_text, new_text = "".join(ta[i1:i2]), "".join(tb[j1:j2])
        if tag == "equal":
            parts.append(("eq", old_text))
        else:
            parts.extend((t, s) for t, s in (("del", old_text), ("ins", new_text)) if s)
    out: list[tuple[str, str]] = []
    for tag, old_text, new_text in _changes_whole(parts):
        if tag == "eq":
            out.append(("eq", old_text))
        else:
            out.extend((t, s) for t, s in (("del", old_text), ("ins", new_text)) if s)
    return _shorten(out)


def _is_token(text: str) -> bool:
    return 0 < len(text) <= TOKEN_CHARS and not _SPACE.search(text)


def _trivial(text: str) -> bool:
    """An unchanged stretch too small to read between two changes: spaces, a comma."""
    return not any(c.isalnum() for c in text) and len(text.strip()) <= 1


def _changes_whole(parts: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(eq, text, text) or (change, old, new): each run of changes as one old and one new.

    A trivial unchanged stretch between two changes joins them (it is in both texts).
    """
    out: list[tuple[str, str, str]] = []
    old: list[str] = []
    new: list[str] = []
    last = len(parts) - 1
    for n, (tag, text) in enumerate(parts):
        between = 0 < n < last and parts[n - 1][0] != "eq" and parts[n + 1][0] != "eq"
        if tag == "eq" and not (between and _trivial(text)):
            if old or new:
                out.append(("change", "".join(old), "".join(new)))
                old, new = [], []
            out.append(("eq", text, text))
        else:
            if tag != "ins":
                old.append(text)
            if tag != "del":
                new.append(text)
    if old or new:
        out.append(("change", "".join(old), "".join(new)))
    return out


def _by_chars(a: str, b: str) -> list[tuple[str, str]]:
    """One token against another, character by character."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.append(("eq", a[i1:i2]))
        else:
            out.extend((t, s) for t, s in (("del", a[i1:i2]), ("ins", b[j1:j2])) if s)
    return out


def _shorten(parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    for tag, text in parts:
        if merged and merged[-1][0] == tag:
            merged[-1] = (tag, merged[-1][1] + text)
        else:
            merged.append((tag, text))
    parts = merged
    out = []
    last = len(parts) - 1
    for n, (tag, text) in enumerate(parts):
        if tag == "eq" and len(text) > 2 * CONTEXT_CHARS + 20:
            head = "" if n == 0 else text[:CONTEXT_CHARS]
            tail = "" if n == last else text[-CONTEXT_CHARS:]
            out.append(("eq", head))
            out.append(("gap", f" … {len(text) - len(head) - len(tail):,} unchanged chars … "))
            out.append(("eq", tail))
        else:
            out.append((tag, text))
    return [(t, s) for t, s in out if s]


# --- naming snapshots: <run>:<step>:<pre|post> --------------------------------------


class SpecError(ValueError):
    """A snapshot reference that is not <run-id>:<step>:<pre|post>."""


@dataclass(frozen=True)
class SnapshotRef:
    run_id: UUID
    step: int
    at: str

    def __str__(self) -> str:
        return f"{self.run_id}:{self.step}:{self.at}"

    @classmethod
    def parse(cls, text: str, find: Callable[[str], UUID] = UUID) -> SnapshotRef:
        """`find` turns the run part into a run's id (a short id needs the database)."""
        parts = text.strip().split(":")
        step = parts[1] if len(parts) == 3 else ""
        if (
            parts[-1] not in ("pre", "post")
            or not (step.isascii() and step.isdigit())
            or len(step) > 9
        ):
            raise SpecError(f"{text[:80]!r} is not <run-id>:<step>:<pre|post>")
        try:
            run_id = find(parts[0])
        except ValueError as exc:
            if find is UUID:
                raise SpecError(f"{parts[0][:40]!r} is not a run id") from None
            raise SpecError(str(exc)) from None
        return cls(run_id, int(parts[1]), parts[2])
