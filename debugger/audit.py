"""The audit log as CSV: operator actions and side-effecting tool calls, newest first."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from heapq import merge
from typing import Any

from django.db.models import QuerySet

from agentrun.models import Event, ToolCall

COLUMNS = [
    "at",
    "record",
    "run",
    "step",
    "actor",
    "action",
    "tool",
    "kind",
    "status",
    "idempotency_key",
    "reason",
    "compensation",
    "detail",
]


class _Echo:
    def write(self, value: str) -> str:
        return value


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    # Spreadsheets run cells that start like formulas: neutralise them.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        text = "'" + text
    return text


def _event_row(e: Event) -> list[Any]:
    payload = e.payload or {}
    return [
        e.created_at.isoformat(),
        "action",
        e.run_id,
        e.step,
        e.actor,
        e.kind,
        payload.get("tool", ""),
        "",
        "",
        payload.get("key", ""),
        e.reason,
        "",
        json.dumps(payload, sort_keys=True, default=str),
    ]


def _call_row(c: ToolCall) -> list[Any]:
    comp = c.compensation or {}
    approval = c.approval or {}
    detail = {"args": c.args, "attempts": len(c.attempts or [])}
    if approval:
        detail["approval"] = approval
    return [
        c.created_at.isoformat(),
        "tool_call",
        c.run_id,
        c.step.number,
        approval.get("by", ""),
        "call",
        c.tool,
        c.kind,
        c.status,
        c.idempotency_key,
        approval.get("comment", ""),
        comp.get("status", ""),
        json.dumps(detail, sort_keys=True, default=str),
    ]


def csv_lines(actions: QuerySet[Event], calls: QuerySet[ToolCall]) -> Iterator[str]:
    """One CSV, both kinds of record merged by time (newest first), streamed."""
    writer = csv.writer(_Echo())
    yield writer.writerow(COLUMNS)
    rows = merge(
        (_event_row(e) for e in actions.iterator(chunk_size=500)),
        (_call_row(c) for c in calls.iterator(chunk_size=500)),
        key=lambda row: row[0],
        reverse=True,
    )
    for row in rows:
        yield writer.writerow([_cell(v) for v in row])
