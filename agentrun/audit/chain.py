"""The event log's hash chains: how an event is hashed, and checking every chain.

Each event belongs to a stream: `run:<run id>` for what the system did in a run,
`operator` for what people did (any event with a user) and for what concerns no run.
Its hash covers its own fields and the hash of the event before it in its stream
(`prev_hash`), so editing, removing or reordering an event breaks the link to the next.

The database computes the hash, in the transaction that inserts the event: on
PostgreSQL a BEFORE INSERT trigger (migration 0020) that locks the stream's head row,
on SQLite an AFTER INSERT trigger calling `sqlite_hash` (registered on every
connection), SQLite serialising writers itself. This module holds the same computation
in Python for verification; `docs/snippets/verify_audit.py` holds it for a reviewer.

The hashed text is a fixed header line, then each field as `<bytes>:<text>` and a
newline, in FIELDS order, NULL as the empty text: see `canonical`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache
from django.db.models import TextField
from django.db.models.functions import Cast
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentrun.models import AuditHead, Event

HEADER = b"agentrun-audit-1\n"
OPERATOR = "operator"
#: What is hashed, in order. `id` and `created_at` are the database's.
FIELDS = (
    "stream",
    "seq",
    "prev_hash",
    "id",
    "run_id",
    "step",
    "kind",
    "actor",
    "user_id",
    "db_role",
    "created_at",
    "reason",
    "payload",
)
#: The retention purge's summary of the run chains it purged (in the operator stream).
PURGE_KIND = "runs_purged"


def canonical(values: Sequence[str]) -> bytes:
    out = [HEADER]
    for value in values:
        data = value.encode()
        out.append(b"%d:%s\n" % (len(data), data))
    return b"".join(out)


def digest(values: Sequence[str]) -> str:
    return hashlib.sha256(canonical(values)).hexdigest()


def stream_of(run_id: Any, user_id: Any) -> str:
    if run_id is not None and user_id is None:
        return f"run:{run_id}"
    return OPERATOR


def run_stream(run_id: Any) -> str:
    return f"run:{run_id}"


def time_text(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


# --- SQLite: the trigger's functions --------------------------------------------------------


def _sqlite_uuid(raw: Any) -> str | None:
    return None if raw is None else str(uuid.UUID(str(raw)))


def sqlite_stream(run_id: Any, user_id: Any) -> str:
    return stream_of(_sqlite_uuid(run_id), user_id)


def sqlite_hash(*raw: Any) -> str:
    """The hash of an event from its columns as SQLite stores them (FIELDS order)."""
    values = dict(zip(FIELDS, raw, strict=True))
    values["run_id"] = _sqlite_uuid(values["run_id"])
    stamp = parse_datetime(str(values["created_at"]))
    assert stamp is not None, values["created_at"]
    values["created_at"] = time_text(timezone.make_aware(stamp, UTC))
    return digest([_text(values[name]) for name in FIELDS])


def register_sqlite(sqlite_connection: Any) -> None:
    sqlite_connection.create_function("agentrun_audit_stream", 2, sqlite_stream, deterministic=True)
    sqlite_connection.create_function(
        "agentrun_audit_hash", len(FIELDS), sqlite_hash, deterministic=True
    )


# --- reading events as they were hashed -----------------------------------------------------

_COLUMNS = (*FIELDS[:-1], "payload_text", "hash")


def records(events: Any = None) -> Iterator[dict[str, str]]:
    """Events (a queryset, all by default) as the texts that were hashed, plus `hash`,
    in stream order. The payload is the database's text of it, as the trigger hashed it."""
    qs = Event.objects.all() if events is None else events
    rows = (
        qs.annotate(payload_text=Cast("payload", output_field=TextField()))
        .order_by("stream", "seq", "id")
        .values_list(*_COLUMNS)
    )
    for row in rows.iterator(chunk_size=2000):
        values = dict(zip(_COLUMNS, row, strict=True))
        values["payload"] = values.pop("payload_text")
        values["created_at"] = time_text(values["created_at"])
        yield {name: _text(values[name]) for name in (*FIELDS, "hash")}


# --- verification ---------------------------------------------------------------------------


@dataclass
class Broken:
    """The first link that does not hold."""

    event_id: str
    stream: str
    seq: str
    what: str

    def __str__(self) -> str:
        return f"event {self.event_id} (stream {self.stream}, position {self.seq}): {self.what}"


@dataclass
class Report:
    events: int = 0
    streams: int = 0
    summaries: int = 0
    broken: Broken | None = None
    checked_at: datetime = field(default_factory=timezone.now)

    @property
    def ok(self) -> bool:
        return self.broken is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "events": self.events,
            "streams": self.streams,
            "summaries": self.summaries,
            "checked_at": self.checked_at.isoformat(),
            "broken": None if self.broken is None else self.broken.__dict__,
        }


def verify() -> Report:
    """Check every chain, each stream's head, and the purge summaries; stop at the first
    break. Records the result for the audit page's badge."""
    report = Report()
    heads = dict(AuditHead.objects.values_list("stream", "seq"))
    summaries: list[dict[str, str]] = []
    last: dict[str, str] | None = None
    for row in records():
        report.broken = _link(last, row, heads)
        if report.broken is not None:
            return _cached(report)
        if last is None or last["stream"] != row["stream"]:
            report.streams += 1
        report.events += 1
        if row["stream"] == OPERATOR and row["kind"] == PURGE_KIND:
            summaries.append(row)
        last = row
    report.broken = _end(last, heads) or _headless(heads) or _check_summaries(summaries, report)
    return _cached(report)


def _link(last: dict[str, str] | None, row: dict[str, str], heads: dict[str, int]) -> Broken | None:
    """What is wrong with `row` after `last` (the record before it in stream order)."""
    if row["stream"] == "":
        return _broken(row, "it is in no chain (it was inserted past the chaining trigger)")
    if last is None or last["stream"] != row["stream"]:
        ended = _end(last, heads)
        if ended is not None:
            return ended
        expected, prev, prev_id = 1, "", ""
    else:
        expected, prev, prev_id = int(last["seq"]) + 1, last["hash"], last["id"]
    if int(row["seq"]) != expected:
        return _broken(row, f"position {expected} of its stream is missing before it")
    if row["prev_hash"] != prev:
        if not prev_id:
            return _broken(row, "it is its stream's first event, yet names a previous hash")
        return _broken(
            row, f"its prev_hash is not the hash of event {prev_id} before it (changed or replaced)"
        )
    computed = digest([row[name] for name in FIELDS])
    if computed != row["hash"]:
        return _broken(
            row,
            f"its fields do not hash to its stored hash ({row['hash']} stored, {computed} "
            "computed): a field was changed after it was written",
        )
    return None


def _end(last: dict[str, str] | None, heads: dict[str, int]) -> Broken | None:
    """The stream that `last` ends must end where its head says."""
    if last is None:
        return None
    head = heads.pop(last["stream"], None)
    if head is None:
        return _broken(last, "its stream has no head row")
    if head != int(last["seq"]):
        return _broken(
            last, f"its stream's head is at position {head}: the events after it are missing"
        )
    return None


def _headless(heads: dict[str, int]) -> Broken | None:
    for stream, seq in heads.items():
        if seq:
            return Broken("-", stream, str(seq), "its head names events that are all gone")
    return None


def _check_summaries(summaries: list[dict[str, str]], report: Report) -> Broken | None:
    """A purge's summary names each purged run's head: that event must still be there."""
    for row in summaries:
        payload = json.loads(row["payload"])
        for run_id, head in (payload.get("chains") or {}).items():
            report.summaries += 1
            found = (
                Event.objects.filter(stream=run_stream(run_id), seq=head["seq"])
                .values_list("hash", flat=True)
                .first()
            )
            if found != head["hash"]:
                return _broken(
                    row,
                    f"its summary of run {run_id} names position {head['seq']} with hash "
                    f"{head['hash']}, and the run's chain has "
                    f"{'no such event' if found is None else found}",
                )
    return None


def _broken(row: dict[str, str], what: str) -> Broken:
    return Broken(row["id"], row["stream"], row["seq"], what)


# --- the audit page's badge -----------------------------------------------------------------

CACHE_KEY = "agentrun:audit:verified"
#: How long the audit page shows a verification before running a new one.
CACHE_SECONDS = 60


def _cached(report: Report) -> Report:
    cache.set(CACHE_KEY, report, CACHE_SECONDS)
    return report


def status() -> Report:
    """The latest verification, at most CACHE_SECONDS old (verifying now if there is none)."""
    found = cache.get(CACHE_KEY)
    return found if isinstance(found, Report) else verify()


def heads_of(run_ids: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Each run's chain head (position and hash): what a purge keeps in its summary."""
    streams = {run_stream(r): str(r) for r in run_ids}
    return {
        streams[stream]: {"seq": seq, "hash": hash_}
        for stream, seq, hash_ in AuditHead.objects.filter(stream__in=list(streams)).values_list(
            "stream", "seq", "hash"
        )
    }
