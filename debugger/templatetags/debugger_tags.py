"""Formatting for the debugger's templates. Every filter returns plain text (autoescaped)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from agentrun.telemetry import tracing
from debugger.formats import human, ms, usd
from debugger.jsontree import human_bytes, input_inline, mark_escapes, run_input_tree

register = template.Library()
register.filter(ms)
register.filter(human)
register.filter(usd)

JSON_LIMIT = 100_000


@register.filter
def trace_id(run: Any) -> str:
    """The run's trace id (32 hex digits)."""
    return tracing.trace_id_of(run)


@register.filter
def trace_url(run: Any) -> str:
    """The run's trace in the operator's tracing UI (AGENTRUN_TRACE_URL), or ""."""
    return tracing.trace_url(run)


@register.filter
def span(value: timedelta | None) -> str:
    return "–" if value is None else ms(value.total_seconds() * 1000)


@register.filter
def waited(seconds: float | None) -> str:
    """A wait, readable at a glance: 0.4 s, 12 s, 3 min, 2 h 05 min, 3 d 4 h (sign ignored)."""
    if seconds is None:
        return "–"
    s = abs(seconds)
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min"
    if s < 86400:
        hours, minutes = divmod(int(s // 60), 60)
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(int(s // 3600), 24)
    return f"{days} d {hours} h"


@register.filter(name="bytes")
def bytes_(value: int | None) -> str:
    return human_bytes(value)


@register.filter
def signed_bytes(value: int | None) -> str:
    if value is None:
        return "–"
    return ("+" if value > 0 else "−" if value < 0 else "±") + human_bytes(abs(value))


@register.filter
def short(value: Any) -> str:
    return str(value)[:8]


@register.filter
def cls(value: Any) -> str:
    """A value made safe to use as (part of) a CSS class name."""
    return re.sub(r"[^a-z0-9_-]", "", str(value).lower())[:40] or "none"


@register.filter
def json_compact(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= int(limit) else text[: int(limit)] + "…"


@register.filter
def json_pretty(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    if len(text) > JSON_LIMIT:
        return (
            text[:JSON_LIMIT]
            + f"\n… ({len(text) - JSON_LIMIT:,} more characters; download the snapshot)"
        )
    return text


@register.filter
def get(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.simple_tag(takes_context=True)
def role_of(context: Any, user: Any) -> str | None:
    """The user's role (viewer, operator, admin) or None: for pages rendered without our context."""
    from agentrun.security.roles import role_of as _role_of

    request = context.get("request")
    if request is not None and getattr(request, "user", None) is user:
        from debugger.access import role

        return role(request)  # looked up once per request
    return _role_of(user)


@register.filter
def last_line(value: Any) -> str:
    lines = [line for line in str(value or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


@register.simple_tag
def step_strip(rows: Any, step_url: str, selected: int | None) -> str:
    from debugger.timeline import strip_html

    return strip_html(rows, step_url, selected)


@register.simple_tag
def step_list(rows: Any, step_url: str, selected: int | None) -> str:
    from debugger.timeline import list_html

    return list_html(rows, step_url, selected)


@register.simple_tag
def compare_rows(cmp: Any, step_url: str, selected: int | None) -> str:
    from debugger.compare import rows_html

    return rows_html(cmp, step_url, selected)


@register.filter
def escapes(value: Any) -> str:
    """Text with agentrun.security.storable's escapes (␛u0000...) highlighted; the rest HTML-escaped."""
    from django.utils.html import conditional_escape

    return mark_safe(mark_escapes(str(conditional_escape(value))))  # noqa: S308 — escaped above


# --- label chips and filters, the run's input ------------------------------------


@register.simple_tag(takes_context=True)
def label_url(context: Any, text: str, remove: bool = False) -> str:
    """The run list with the current filters and this label filter added (or removed)."""
    from django.http import QueryDict
    from django.urls import reverse

    request = context.get("request")
    on_the_list = getattr(getattr(request, "resolver_match", None), "url_name", "") == "run-list"
    query = request.GET.copy() if on_the_list else QueryDict(mutable=True)
    for name in ("page", "v"):
        query.pop(name, None)
    labels = [t.strip() for t in query.getlist("label") if t.strip()]
    if remove:
        labels = [t for t in labels if t != text]
    elif text not in labels:
        labels.append(text)
    if labels:
        query.setlist("label", labels)
    else:
        query.pop("label", None)
    url = reverse("debugger:run-list")
    return f"{url}?{query.urlencode()}" if query else url


@register.filter
def one_line(value: Any) -> str:
    """Text on one line: runs of whitespace (newlines included) become one space."""
    return " ".join(str(value or "").split())


@register.simple_tag(takes_context=True)
def run_input(context: Any, run: Any) -> str:
    """The run's input as a JSON tree (redacted). Not in the run page's live refresh: the
    panel is kept as it is there (hx-preserve), so it stays open."""
    match = getattr(context.get("request"), "resolver_match", None)
    if getattr(match, "url_name", "") == "run-live":
        return ""
    inline, size = input_inline(run)
    if inline:
        return format_html('<div class="input-body" hx-disable>{}</div>', run_input_tree(run))
    # A long input: fetched when the panel is opened (the link works without htmx too).
    url = reverse("debugger:run-input", args=[run.pk])
    items = _items(run.input)
    return format_html(
        '<div class="input-body input-lazy" id="run-input-tree" hx-get="{}" '
        'hx-trigger="toggle once from:closest details" hx-target="this" hx-swap="outerHTML">'
        '<a href="{}">Show the input</a> <span class="sub">({}{}, loaded when opened)</span></div>',
        url,
        url,
        human_bytes(size) if size is not None else "deeply nested",
        items,
    )


def _items(value: Any) -> str:
    """How many items the input's largest list or object holds, as words (", 10,000 steps")."""
    if not isinstance(value, dict):
        return f", {len(value):,} items" if isinstance(value, list) else ""
    sizes = [(len(v), k) for k, v in value.items() if isinstance(v, list | dict)]
    if not sizes:
        return ""
    n, key = max(sizes)
    return f", {n:,} {key}"


# --- timestamps: one format on every page, the full time on hover, the browser's zone ---

# The visible formats by style, and the tooltip's (the same in localtime.js).
WHEN_FORMATS = {"full": "%b %-d, %H:%M:%S", "ms": "%H:%M:%S.{ms}"}
WHEN_TITLE = "%Y-%m-%d %H:%M:%S.{ms} %Z"


def _moment(value: Any) -> Any:
    from django.utils.dateparse import parse_datetime

    try:
        moment = parse_datetime(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if moment is None or not hasattr(moment, "isoformat"):
        return None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    return timezone.localtime(moment)


@register.filter
def stamp(value: Any) -> str:
    """The full time as plain text (`2026-11-29 01:25:08.165 UTC`), for a title attribute."""
    moment = _moment(value)
    if moment is None:
        return ""
    return moment.strftime(WHEN_TITLE.format(ms=f"{moment.microsecond // 1000:03d}"))


@register.simple_tag
def when(value: Any, style: str = "full") -> str:
    """A <time> element: `Nov 29, 01:25:08` (or `01:25:08.165` for "ms") in the server's
    zone, the full time in its title; static/debugger/localtime.js rewrites both in the
    browser's time zone. A datetime or an ISO 8601 text; "–" for none."""
    moment = _moment(value)
    if moment is None:
        return "–"
    ms = f"{moment.microsecond // 1000:03d}"
    style = style if style in WHEN_FORMATS else "full"
    return format_html(
        '<time datetime="{}" data-when="{}" title="{}">{}</time>',
        moment.isoformat(),
        style,
        moment.strftime(WHEN_TITLE.format(ms=ms)),
        moment.strftime(WHEN_FORMATS[style].format(ms=ms)),
    )
