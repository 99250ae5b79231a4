"""The event log's hash chains: how an event is hashed, and checking every chain.

Each event belongs to a stream: `run:<run id>` for what the system did in a run,
`operator` for what people did (any event with a user) and for what concerns no run.
Its hash covers its own fields and the hash of the event before it in its stream
(`prev_hash`), so editing, removing or reordering an event breaks the link to the next.

The database computes the hash, in the transaction that inserts the event: on
PostgreSQL a BEFORE INSERT trigger (migration 0021) that locks the stream's head row,
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
    #: When every event was last checked, and the highest id checked (the badge's
    #: incremental checks start after it).
    full_at: datetime = field(default_factory=timezone.now)
    max_id: int = 0

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
    report.full_at = report.checked_at
    return _cached(_scan(report, records(), full=True))


def verify_since(before: Report) -> Report:
    """Check the events written since `before` (ids above its highest): each one's hash,
    its link to the event before it (read from the log, checked by an earlier pass), the
    heads of their streams and any new purge summary."""
    report = Report(
        events=before.events,
        streams=before.streams,
        summaries=before.summaries,
        full_at=before.full_at,
        max_id=before.max_id,
    )
    return _cached(_scan(report, records(Event.objects.filter(id__gt=before.max_id)), full=False))


def _scan(report: Report, rows: Iterable[dict[str, str]], *, full: bool) -> Report:
    summaries: list[dict[str, str]] = []
    ends: dict[str, dict[str, str]] = {}
    last: dict[str, str] | None = None
    for row in rows:
        if last is None or last["stream"] != row["stream"]:
            last = _before(row)
            if last is None:
                report.streams += 1
        report.broken = _link(last, row)
        if report.broken is not None:
            return report
        report.events += 1
        report.max_id = max(report.max_id, int(row["id"]))
        if row["stream"] == OPERATOR and row["kind"] == PURGE_KIND:
            summaries.append(row)
        ends[row["stream"]] = last = row
    report.broken = _heads(ends, full=full) or _check_summaries(summaries, report)
    return report


def _before(row: dict[str, str]) -> dict[str, str] | None:
    """The event before `row` in its stream, as stored (None for a stream's first)."""
    seq = int(row["seq"])
    if seq <= 1:
        return None
    found = (
        Event.objects.filter(stream=row["stream"], seq=seq - 1).values_list("id", "hash").first()
    )
    if found is None:
        return {"stream": row["stream"], "seq": str(seq - 2), "hash": "", "id": "?"}
    return {"stream": row["stream"], "seq": str(seq - 1), "hash": found[1], "id": str(found[0])}


def _link(last: dict[str, str] | None, row: dict[str, str]) -> Broken | None:
    """What is wrong with `row` after `last` (the event before it in its stream)."""
    if row["stream"] == "":
        return _broken(row, "it is in no chain (it was inserted past the chaining trigger)")
    expected, prev, prev_id = (
        (1, "", "")
        if last is None
        else (
            int(last["seq"]) + 1,
            last["hash"],
            last["id"],
        )
    )
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


def _heads(ends: dict[str, dict[str, str]], *, full: bool) -> Broken | None:
    """Each stream ends where its head says. Heads are read after the events, so a head
    ahead of the last event read is fine when the next event is there now (appended
    during the scan); a full pass also finds heads whose stream has no event at all."""
    heads = dict(AuditHead.objects.values_list("stream", "seq"))
    for stream, last in ends.items():
        head = heads.pop(stream, None)
        seq = int(last["seq"])
        if head is None:
            return _broken(last, "its stream has no head row")
        if head < seq or (head > seq and not _exists(stream, seq + 1)):
            return _broken(
                last, f"its stream's head is at position {head}: the events after it are missing"
            )
    if full:
        for stream, head in heads.items():
            if head and not _exists(stream, 1):
                return Broken("-", stream, str(head), "its head names events that are all gone")
    return None


def _exists(stream: str, seq: int) -> bool:
    return Event.objects.filter(stream=stream, seq=seq).exists()


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
#: How long the audit page shows a verification before checking what was written since.
CACHE_SECONDS = 60
#: How often the audit page's checks go over every event again.
FULL_SECONDS = 600


def _cached(report: Report) -> Report:
    cache.set(CACHE_KEY, report, FULL_SECONDS)
    return report


def status() -> Report:
    """The audit page's verification: at most CACHE_SECONDS old; the events written since
    the last one checked on their own; every event again each FULL_SECONDS, or after a
    break."""
    found = cache.get(CACHE_KEY)
    now = timezone.now()
    if not isinstance(found, Report) or found.broken is not None:
        return verify()
    if (now - found.full_at).total_seconds() >= FULL_SECONDS:
        return verify()
    if (now - found.checked_at).total_seconds() < CACHE_SECONDS:
        return found
    return verify_since(found)


def heads_of(run_ids: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Each run's chain head (position and hash): what a purge keeps in its summary."""
    streams = {run_stream(r): str(r) for r in run_ids}
    return {
        streams[stream]: {"seq": seq, "hash": hash_}
        for stream, seq, hash_ in AuditHead.objects.filter(stream__in=list(streams)).values_list(
            "stream", "seq", "hash"
        )
    }
