"""The event log exported with its hashes, as CSV or JSON lines, for review offline.

Each record holds the texts that were hashed (agentrun.audit.chain.FIELDS, in that
order) and the event's hash, in stream order, so a reviewer can recompute every hash
and every link without agentrun (docs/snippets/verify_audit.py). A filtered export
holds parts of streams: each record still checks on its own, and each link whose two
ends are both in the file.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from agentrun.audit import chain
from agentrun.models import Event

COLUMNS = (*chain.FIELDS, "hash")
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8"}
# A spreadsheet runs a cell that starts like a formula: such a cell (and one that starts
# with the quote itself) gets a leading quote, which the verifying script takes off.
_FORMULA = ("=", "+", "-", "@", "\t", "\r", "'")


@dataclass
class Filter:
    """Which events: of a run, by an operator (the actor's name), of an action (the
    event's kind), written at or after `since` and before `until`."""

    run: Any = None
    operator: str = ""
    action: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def events(self) -> QuerySet[Event]:
        events = Event.objects.all()
        if self.run is not None:
            events = events.filter(run_id=self.run)
        if self.operator:
            events = events.filter(actor=self.operator)
        if self.action:
            events = events.filter(kind=self.action)
        if self.since is not None:
            events = events.filter(created_at__gte=self.since)
        if self.until is not None:
            events = events.filter(created_at__lt=self.until)
        return events


def _cell(text: str) -> str:
    return "'" + text if text[:1] in _FORMULA else text


class _Echo:
    def write(self, value: str) -> str:
        return value


def csv_lines(which: Filter) -> Iterator[str]:
    writer = csv.writer(_Echo(), lineterminator="\n")
    yield writer.writerow(COLUMNS)
    for record in chain.records(which.events()):
        yield writer.writerow([_cell(record[name]) for name in COLUMNS])


def jsonl_lines(which: Filter) -> Iterator[str]:
    for record in chain.records(which.events()):
        yield json.dumps(record, ensure_ascii=False) + "\n"


def lines(which: Filter, form: str) -> Iterator[str]:
    return csv_lines(which) if form == "csv" else jsonl_lines(which)


def filename(form: str, now: datetime) -> str:
    return f"agentrun-audit-chain-{now:%Y%m%d-%H%M}.{form}"
