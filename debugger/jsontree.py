"""A JSON value as a collapsible HTML tree: keys, types, sizes, copyable paths.

States can be megabytes, so the tree is bounded: each container shows at
most `per_container` children (the newest, for lists) and the whole tree at
most `budget` nodes; what is left out is a link to the subtree on its own
page (`?path=...&from=...`). Every piece of text is escaped here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape as e
from typing import Any

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from agentrun.security.redact import redact
from agentrun.state import json_type
from agentrun.store.watch import format_path

Path = tuple[str | int, ...]

STRING_PREVIEW = 160
STRING_FULL_LIMIT = 200_000


def json_size(value: Any) -> int | None:
    """Bytes of value as compact JSON (non-ASCII counted as escapes: the fast encoder);
    None for a value nested too deep for the encoder."""
    try:
        return len(json.dumps(value, separators=(",", ":"), default=str))
    except RecursionError:
        return None


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1024 or unit == "MB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} MB"


# --- paths: memory.notes["a b"][3] (written as agentrun.store.watch writes them) ---------


class PathError(ValueError):
    pass


_TOKEN = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\[(-?\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def parse_path(text: str) -> Path:
    """Inverse of format_path; raises PathError on anything else."""
    out: list[str | int] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or (m.group(0).startswith(".") and pos == 0):
            raise PathError(f"bad path at {text[pos : pos + 20]!r}")
        name, index, quoted = m.groups()
        if name is not None:
            out.append(name)
        elif index is not None:
            out.append(int(index))
        else:
            out.append(json.loads(quoted))
        pos = m.end()
    return tuple(out)


def resolve(value: Any, path: Sequence[str | int]) -> Any:
    """The subtree at path; KeyError when it isn't there."""
    for step in path:
        found = (isinstance(value, dict) and isinstance(step, str) and step in value) or (
            isinstance(value, list) and isinstance(step, int) and -len(value) <= step < len(value)
        )
        if not found:
            raise KeyError(format_path(path))
        value = value[step]
    return value


# --- rendering ------------------------------------------------------------------


@dataclass
class TreeOptions:
    link: Callable[[Path, int | None], str]  # url of the subtree page for (path, from)
    budget: int = 3000
    per_container: int = 100  # a page of a list: the newest 100, links to the rest
    open_depth: int = 2
    # Levels drawn below the tree's root; deeper containers link to their subtree's own
    # page, so a value of any depth is drawn without deep recursion, a page at a time.
    max_depth: int = 32
    watch: Callable[[Path], str] | None = None  # url of the value's history


class _Renderer:
    def __init__(self, opts: TreeOptions) -> None:
        self.opts = opts
        self.left = opts.budget
        self.parts: list[str] = []

    def node(
        self,
        key: str | int | None,
        value: Any,
        path: Path,
        depth: int,
        start: int | None = None,
        size: int | None = None,
    ) -> None:
        self.left -= 1
        if isinstance(value, dict | list):
            self.container(key, value, path, depth, start, size)
        else:
            self.leaf(key, value, path)

    # Markup is built with f-strings over e() (html.escape): the tree of a 2.5 MB state
    # has thousands of nodes and format_html's lazy machinery would triple the time.
    # Every value interpolated below is either e()-escaped or a number we computed.

    def key(self, key: str | int | None) -> str:
        label = "$" if key is None else (f"[{key}]" if isinstance(key, int) else key)
        return f'<span class="jt-key">{e(label)}</span>'

    def copy(self, path: Path) -> str:
        text = e(format_path(path) or "$")
        button = f'<button type="button" class="jt-copy" data-path="{text}" title="Copy path {text}">copy</button>'
        if self.opts.watch is None or not path:
            return button
        url = e(self.opts.watch(path))
        return f'{button}<a class="jt-watch" href="{url}" title="Every step that changed {text}">history</a>'

    def leaf(self, key: str | int | None, value: Any, path: Path) -> None:
        kind = json_type(value)
        more = ""
        if isinstance(value, str):
            value_html, meta, more = self.string(value)
        else:
            text = "[]" if value == [] else "{}" if value == {} else json.dumps(value, default=str)
            value_html = f'<span class="jt-val jt-{kind}">{e(text)}</span>'
            meta = kind
        self.parts.append(
            f'<li class="jt-leaf">{self.key(key)}<span class="jt-body">{value_html} '
            f'<span class="jt-meta">{e(meta)}</span> {self.copy(path)}{more}</span></li>'
        )

    def string(self, value: str) -> tuple[str, str, str]:
        meta = f"string · {len(value):,} chars"
        if len(value) <= STRING_PREVIEW and "\n" not in value:
            return f'<span class="jt-val jt-string">"{mark_escapes(e(value))}"</span>', meta, ""
        first = value.split("\n", 1)[0][:STRING_PREVIEW]
        cut = (
            ""
            if len(value) <= STRING_FULL_LIMIT
            else f"… (first {STRING_FULL_LIMIT:,} chars; download for all)"
        )
        more = (
            f'<details class="jt-more"><summary>show all</summary>'
            f'<pre class="jt-pre">{mark_escapes(e(value[:STRING_FULL_LIMIT]))}{cut}</pre></details>'
        )
        return f'<span class="jt-val jt-string">"{mark_escapes(e(first))}…"</span>', meta, more

    def container(
        self,
        key: str | int | None,
        value: dict | list,
        path: Path,
        depth: int,
        start: int | None,
        size: int | None,
    ) -> None:
        if not value:
            self.leaf(key, value, path)
            return
        is_dict = isinstance(value, dict)
        n = len(value)
        count = f"{n:,} {'key' if is_dict else 'item'}{'' if n == 1 else 's'}"
        size = json_size(value) if size is None else size
        meta = f"{'object' if is_dict else 'array'} · {count} · {human_bytes(size)}"
        if (self.left <= 0 or depth >= self.opts.max_depth) and depth > 0:
            link = e(self.opts.link(path, None))
            self.parts.append(
                f'<li class="jt-stub">{self.key(key)}<span class="jt-body"><span class="jt-meta">'
                f'{meta}</span> <a class="jt-open" href="{link}">open subtree</a> '
                f"{self.copy(path)}</span></li>"
            )
            return
        is_open = " open" if depth < self.opts.open_depth else ""
        self.parts.append(
            f'<li class="jt-node"><details{is_open}><summary>{self.key(key)}'
            f'<span class="jt-meta">{meta}</span><span class="jt-peek">{e(peek(value))}</span>'
            f'{self.copy(path)}</summary><ul class="jt-children">'
        )
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        limit = self.opts.per_container
        if n > limit:
            # Lists open on their newest items: that's where an agent's latest work is.
            lo = (0 if is_dict else n - limit) if start is None else max(0, min(start, n - 1))
            hi = min(n, lo + limit)
            if lo > 0:
                self.more(path, f"… {lo:,} earlier", max(0, lo - limit), lo)
            for k, v in items[lo:hi]:
                self.node(k, v, (*path, k), depth + 1)
            if hi < n:
                self.more(path, f"… {n - hi:,} more", hi, min(n, hi + limit))
        else:
            for k, v in items:
                self.node(k, v, (*path, k), depth + 1)
        self.parts.append("</ul></details></li>")

    def more(self, path: Path, label: str, lo: int, hi: int) -> None:
        link = e(self.opts.link(path, lo))
        self.parts.append(
            f'<li class="jt-gap">{e(label)} <a href="{link}">show {lo:,}–{hi - 1:,}</a></li>'
        )


PEEK_CHARS = 90


_ESCAPED = re.compile("\u241bu([0-9a-f]{4})")


def _mark(match: re.Match[str]) -> str:
    code = match.group(1)
    what = "a NUL" if code == "0000" else "a lone surrogate" if code[0] == "d" else "this sign"
    # Shown as \uXXXX (every font has it; many lack the escape sign itself).
    return (
        f'<mark class="esc" title="Sent as U+{code.upper()} ({what}), which the database '
        f"can't store: kept escaped as {match.group(0)}\">\\u{code}</mark>"
    )


def mark_escapes(html: str) -> str:
    """Highlight the escapes of agentrun.security.storable in already-escaped HTML, so an operator
    sees where a model or a tool sent text the database can't hold."""
    return _ESCAPED.sub(_mark, html) if "\u241b" in html else html


def peek(value: Any, limit: int = PEEK_CHARS) -> str:
    """A one-line glimpse of a container's scalar fields, for when it is collapsed."""
    parts: list[str] = []
    used = 0
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        if isinstance(v, dict | list):
            text = "{…}" if isinstance(v, dict) else "[…]"
        elif isinstance(v, str):
            text = json.dumps(v[:limit], ensure_ascii=False)
        else:
            text = json.dumps(v, default=str)
        part = f"{k}: {text}" if isinstance(value, dict) else text
        parts.append(part)
        used += len(part) + 2
        if used > limit:
            break
    joined = ", ".join(parts)
    return joined[:limit] + ("…" if len(joined) > limit else "")


def render_tree(
    value: Any,
    opts: TreeOptions,
    *,
    path: Path = (),
    start: int | None = None,
    size: int | None = None,
) -> SafeString:
    """HTML for value (found at path in its state) as a <ul class="jt"> tree."""
    r = _Renderer(opts)
    key = path[-1] if path else None
    r.node(key, value, path, 0, start=start, size=size)
    return mark_safe('<ul class="jt">' + "".join(r.parts) + "</ul>")  # noqa: S308 - built with e()


#: An input larger than this (as JSON) is not drawn in the run page: its panel fetches the
#: tree when it is opened (a 10,000-step script would be most of the page).
INPUT_INLINE_BYTES = 16 * 1024


def input_inline(run: Any) -> tuple[bool, int | None]:
    """Whether the run page draws the run's input in place, and the input's JSON size."""
    size = json_size(run.input)
    return size is not None and size <= INPUT_INLINE_BYTES, size


def run_input_tree(run: Any) -> SafeString:
    """The run's input as a JSON tree, secrets redacted; what doesn't fit links to the
    whole input as JSON."""
    url = reverse("debugger:run-input-json", args=[run.pk])
    return render_tree(redact(run.input), TreeOptions(link=lambda path, start: url))
