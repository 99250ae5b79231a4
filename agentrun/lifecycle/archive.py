"""Export a run to a self-contained archive, and import one, read-only (docs/ARCHIVE.md).

An archive is gzip'ed JSON lines: a manifest, then for each run (fork ancestors
first) its run record, snapshots, steps, tool calls and events, then an `end`
line with the line count and the SHA-256 of every line before it. Export streams
it: `export_chunks()` yields compressed bytes as the rows are read.

Import reads an archive twice. The first pass checks everything (the format
version, every record, every snapshot's content hash by replaying the chain, the
trailer's digest, that no run already exists here) and writes nothing; the second
writes it all in one transaction, and rolls back if the bytes changed meanwhile.
Both passes inflate at most a chunk at a time and stop at the size limits
(`AGENTRUN_IMPORT_MAX_BYTES` compressed, `..._EXPANDED_BYTES` inflated,
`..._LINE_BYTES` per line), so a gzip bomb costs what the limits allow.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from itertools import islice
from typing import IO, Any

from django.conf import settings
from django.db import DatabaseError, connection, models, transaction
from django.db.models import ExpressionWrapper, F
from django.utils import timezone

from agentrun.lifecycle import labels as run_labels
from agentrun.models import (
    CompressedJSONField,
    Event,
    HashField,
    Run,
    RunLabel,
    Snapshot,
    SnapshotKind,
    Step,
    ToolCall,
)
from agentrun.security import storable
from agentrun.state import SCHEMA_VERSION
from agentrun.store import checkpoints, delta, hashing, snapshots
from agentrun.store.codec import inflate_many
from agentrun.store.paths import touched_paths

FORMAT = "agentrun-run-archive"
FORMAT_VERSION = 1
MEDIA_TYPE = "application/gzip"
CHUNK = 256 * 1024
_HEX = re.compile(r"(?:[0-9a-f]{2}){1,64}")


class ArchiveError(ValueError):
    """The archive can't be imported; nothing was stored. `status`: the HTTP answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def agentrun_version() -> str:
    try:
        return version("agentrun")
    except PackageNotFoundError:
        return "0.1.0"


# --- the records ---------------------------------------------------------------------------

# Fields written as they are, per model. Links are written by value (a run's id, a step's
# number, a user's name); a run's lease, its import marker and the row ids are not written.
_RUN_SKIP = {
    "id",
    "parent",
    "forked_from",
    "created_by",
    "lease_owner",
    "lease_expires_at",
    "updated_at",
    "imported_at",
    "imported",
    # This deployment's retention of the run, not part of its record.
    "pinned_at",
    "pinned_by",
    "pin_reason",
    "purged_at",
    "purge_done",
    # The replay batch that made a fork is this deployment's too.
    "batch",
}
RUN_FIELDS = [f for f in Run._meta.concrete_fields if f.name not in _RUN_SKIP]
SNAPSHOT_FIELDS = [f for f in Snapshot._meta.concrete_fields if f.name not in ("id", "run")]
# When this deployment emits a step's spans again is its own, not part of the record.
STEP_FIELDS = [f for f in Step._meta.concrete_fields if f.name not in ("id", "run", "trace_due_at")]
TOOL_CALL_FIELDS = [
    f for f in ToolCall._meta.concrete_fields if f.name not in ("id", "run", "step")
]
# The chain's fields are the database's where the event is stored: an import is chained anew.
CHAIN_FIELDS = ("stream", "seq", "prev_hash", "hash", "db_role")
EVENT_FIELDS = [
    f for f in Event._meta.concrete_fields if f.name not in ("id", "run", "user", *CHAIN_FIELDS)
]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _fields(obj: models.Model, fields: list[Any]) -> dict[str, Any]:
    return {f.name: _plain(getattr(obj, f.attname)) for f in fields}


class Raw(bytes):
    """A value that is JSON text already (a compressed column's, inflated): written as is."""


def _line(record: dict[str, Any]) -> bytes:
    """One compact JSON line; a lone surrogate (not UTF-8) is kept as a \\u escape."""
    raws = [(k, v) for k, v in record.items() if isinstance(v, Raw)]
    if raws:
        record = {k: v for k, v in record.items() if not isinstance(v, Raw)}
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        line = text.encode()
    except UnicodeEncodeError:
        line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
    if raws:
        line = line[:-1] + b"".join(b',"' + k.encode() + b'":' + v for k, v in raws) + b"}"
    return line + b"\n"


def _rows(qs: Any, fields: list[Any], *extra: str) -> Iterator[dict[str, Any]]:
    """The fields of each row by name, and the `extra` lookups; a compressed JSON column
    comes as its stored text (Raw), never parsed and written again."""
    columns: list[Any] = []
    for f in fields:
        if isinstance(f, CompressedJSONField):
            columns.append(ExpressionWrapper(F(f.attname), output_field=models.BinaryField()))
        else:
            columns.append(f.attname)
    names = [f.name for f in fields] + list(extra)
    packed = [names.index(f.name) for f in fields if isinstance(f, CompressedJSONField)]
    rows = qs.values_list(*columns, *extra).iterator(chunk_size=500)
    while chunk := [list(row) for row in islice(rows, 500)]:
        for i in packed:
            # A packed tool result reads its step's delta: one query a chunk (inflate_many).
            blobs = [row[i] for row in chunk if row[i] is not None]
            texts = iter(inflate_many(blobs))
            for row in chunk:
                row[i] = Raw(b"null" if row[i] is None else next(texts))
        for row in chunk:
            yield {k: _plain(v) for k, v in zip(names, row, strict=True)}


# --- export --------------------------------------------------------------------------------


def runs_to_export(run: Run, ancestors: bool = False) -> list[Run]:
    """The run, and with `ancestors` the runs it was forked from, oldest first."""
    return run.lineage() if ancestors else [run]


def _source(run: Run) -> dict[str, Any] | None:
    snap = run.forked_from
    if snap is None:  # an imported fork whose parent stayed behind knows it by value
        return (run.imported or {}).get("forked_from")
    return {"step": snap.step, "at": snap.at, "hash": snap.hash}


def _parent(run: Run) -> str | None:
    return str(run.parent_id) if run.parent_id else (run.imported or {}).get("parent")


def _creator(run: Run) -> str | None:
    if run.created_by:
        return run.created_by.get_username()
    return (run.imported or {}).get("created_by")  # from where it was imported


def _run_summary(run: Run, included: set[Any]) -> dict[str, Any]:
    last = run.snapshots.order_by("-seq").values_list("hash", flat=True).first()
    return {
        "id": str(run.pk),
        "agent": run.agent,
        "agent_version": run.agent_version,
        "status": run.status,
        "parent": _parent(run),
        "parent_in_archive": run.parent_id in included,
        "forked_from": _source(run),
        "steps": run.steps.count(),
        "snapshots": run.snapshots.count(),
        "tool_calls": run.tool_calls.count(),
        "events": Event.objects.filter(run_id=run.pk).count(),
        "last_hash": last,
    }


def manifest(runs: list[Run], *, user: Any = None) -> dict[str, Any]:
    included = {r.pk for r in runs}
    root = runs[-1]
    return {
        "type": "manifest",
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "agentrun_version": agentrun_version(),
        "state_schema_version": SCHEMA_VERSION,
        "exported_at": timezone.now().isoformat(),
        "exported_by": user.get_username() if user is not None else None,
        "source_host": socket.gethostname(),
        "run": str(root.pk),
        "agent": root.agent,
        "agent_version": root.agent_version,
        "runs": [_run_summary(r, included) for r in runs],
        # The whole parent chain, whether or not its runs are in the archive.
        "lineage": _lineage(root),
    }


def _lineage(root: Run) -> list[dict[str, Any]]:
    """The whole parent chain, oldest first: the runs here, and before them the ones an
    imported run's archive named but didn't hold."""
    chain = root.lineage()
    here = {str(r.pk) for r in chain}
    known = (chain[0].imported or {}).get("lineage")
    before = [n for n in known if n.get("id") not in here] if isinstance(known, list) else []
    return before + [
        {"id": str(r.pk), "agent": r.agent, "status": r.status, "forked_from": _source(r)}
        for r in chain
    ]


def _run_record(run: Run, included: set[Any]) -> dict[str, Any]:
    return {
        "type": "run",
        "id": str(run.pk),
        "parent": _parent(run),
        "parent_in_archive": run.parent_id in included,
        "forked_from": _source(run),
        "created_by": _creator(run),
        "labels": dict(RunLabel.objects.filter(run=run).values_list("key", "value")),
        **_fields(run, RUN_FIELDS),
    }


def _snapshot_records(run: Run, self_contained: bool) -> Iterator[dict[str, Any]]:
    rows = Snapshot.objects.filter(run=run).order_by("seq")
    for values in _rows(rows, SNAPSHOT_FIELDS):
        record = {"type": "snapshot", "run": str(run.pk), **values}
        if values["kind"] == SnapshotKind.FORK and self_contained:
            # Its source is in a run the archive doesn't hold: write the state itself.
            state = snapshots.load(run.pk, values["step"], values["at"])
            record.update(
                kind=SnapshotKind.FULL, data=state, stored_bytes=values["size"], chain_bytes=0
            )
        yield record


def _step_records(run: Run) -> Iterator[dict[str, Any]]:
    for values in _rows(Step.objects.filter(run=run).order_by("number"), STEP_FIELDS):
        yield {"type": "step", "run": str(run.pk), **values}


def _tool_call_records(run: Run) -> Iterator[dict[str, Any]]:
    calls = ToolCall.objects.filter(run=run).order_by("step__number", "index")
    for values in _rows(calls, TOOL_CALL_FIELDS, "step__number"):
        step = values.pop("step__number")
        yield {"type": "tool_call", "run": str(run.pk), "step": step, **values}


def _event_records(run: Run) -> Iterator[dict[str, Any]]:
    events = Event.objects.filter(run_id=run.pk).order_by("created_at", "id")
    for values in _rows(events, EVENT_FIELDS):
        yield {"type": "event", "run": str(run.pk), **values}


def export_records(run: Run, *, ancestors: bool = False, user: Any = None) -> Iterator[dict]:
    runs = runs_to_export(run, ancestors)
    included = {r.pk for r in runs}
    yield manifest(runs, user=user)
    for r in runs:
        yield _run_record(r, included)
        yield from _snapshot_records(r, self_contained=r.parent_id not in included)
        yield from _step_records(r)
        yield from _tool_call_records(r)
        yield from _event_records(r)


@contextmanager
def _consistent_read() -> Iterator[None]:
    """One transaction that sees the run as it was when the export began, while its
    worker may go on: the manifest's counts then match the rows that follow."""
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    else:
        with transaction.atomic():  # SQLite: a read transaction is a snapshot already
            yield


def export_lines(run: Run, *, ancestors: bool = False, user: Any = None) -> Iterator[bytes]:
    """The archive's lines, uncompressed, the trailer last."""
    digest = hashlib.sha256()
    count = 0
    with _consistent_read():
        for record in export_records(run, ancestors=ancestors, user=user):
            line = _line(record)
            digest.update(line)
            count += 1
            yield line
    yield _line({"type": "end", "lines": count, "sha256": digest.hexdigest()})


def export_chunks(run: Run, *, ancestors: bool = False, user: Any = None) -> Iterator[bytes]:
    """The gzip'ed archive in chunks of about CHUNK bytes, as the rows are read."""
    # Level 1: three times faster than 6 and within a tenth of its size on this JSON.
    gz = zlib.compressobj(1, zlib.DEFLATED, 31)
    pending: list[bytes] = []
    size = 0
    for line in export_lines(run, ancestors=ancestors, user=user):
        out = gz.compress(line)
        if out:
            pending.append(out)
            size += len(out)
            if size >= CHUNK:
                yield b"".join(pending)
                pending, size = [], 0
    pending.append(gz.flush())
    yield b"".join(pending)


def export_problem(run: Run) -> str | None:
    """Why the run can't be exported whole, if it can't."""
    if getattr(run, "purged_at", None) is not None:
        return (
            f"run {run.pk} was purged by retention: its steps and snapshots are gone, "
            "so it can't be exported"
        )
    return None


def filename(run: Run) -> str:
    return f"run-{run.pk}.agentrun.jsonl.gz"


# --- reading an archive, bounded ----------------------------------------------------------


def _limits() -> tuple[int, int, int]:
    return (
        settings.AGENTRUN_IMPORT_MAX_BYTES,
        settings.AGENTRUN_IMPORT_MAX_EXPANDED_BYTES,
        settings.AGENTRUN_IMPORT_MAX_LINE_BYTES,
    )


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:g} MiB"


def read_lines(stream: IO[bytes], sha: Any = None) -> Iterator[tuple[int, bytes]]:
    """(number, line) of the gzip'ed stream, inflating a bounded chunk at a time.

    `sha` (a hashlib object) is fed the compressed bytes. ArchiveError when the
    stream is not gzip, is corrupt or truncated, or passes a size limit.
    """
    max_bytes, max_expanded, max_line = _limits()
    inflate = zlib.decompressobj(31)
    read = expanded = 0
    pieces: list[bytes] = []  # the line being read
    pending = 0  # its bytes so far
    number = 0
    while chunk := stream.read(CHUNK):
        if read == 0 and chunk[:2] != b"\x1f\x8b":
            raise ArchiveError("not an agentrun archive: the file is not gzip-compressed")
        read += len(chunk)
        if read > max_bytes:
            raise ArchiveError(
                f"the archive is larger than the limit of {_mib(max_bytes)} "
                "(AGENTRUN_IMPORT_MAX_BYTES)",
                413,
            )
        if sha is not None:
            sha.update(chunk)
        data = chunk
        while True:
            if inflate.eof:
                raise ArchiveError("the archive has bytes after its gzip stream")
            try:
                # At most CHUNK bytes inflated at a time: a bomb never gets ahead of the count.
                out = inflate.decompress(data, CHUNK)
            except zlib.error as exc:
                raise ArchiveError(f"the archive is corrupt: {exc}") from None
            data = inflate.unconsumed_tail
            expanded += len(out)
            if expanded > max_expanded:
                raise ArchiveError(
                    f"the archive inflates to more than {_mib(max_expanded)} "
                    "(AGENTRUN_IMPORT_MAX_EXPANDED_BYTES): refused as a possible gzip bomb",
                    413,
                )
            parts = out.split(b"\n")
            for part in parts[:-1]:
                pieces.append(part)
                number += 1
                yield number, b"".join(pieces)
                pieces, pending = [], 0
            pieces.append(parts[-1])
            pending += len(parts[-1])
            if pending > max_line:
                raise ArchiveError(
                    f"line {number + 1} of the archive is longer than {_mib(max_line)} "
                    "(AGENTRUN_IMPORT_MAX_LINE_BYTES)",
                    413,
                )
            if inflate.eof and (data or inflate.unused_data):
                raise ArchiveError("the archive has bytes after its gzip stream")
            if inflate.eof or (not data and len(out) < CHUNK):
                break
    if read == 0:
        raise ArchiveError("the archive is empty")
    if not inflate.eof:
        raise ArchiveError("the archive is truncated: its gzip stream ends early")
    if pending:
        raise ArchiveError("the archive is truncated: its last line is incomplete")


def spool(source: IO[bytes], target: IO[bytes]) -> int:
    """Copy an upload to `target`, refusing it once past AGENTRUN_IMPORT_MAX_BYTES."""
    limit = settings.AGENTRUN_IMPORT_MAX_BYTES
    total = 0
    while chunk := source.read(CHUNK):
        total += len(chunk)
        if total > limit:
            raise ArchiveError(
                f"the archive is larger than the limit of {_mib(limit)} "
                "(AGENTRUN_IMPORT_MAX_BYTES)",
                413,
            )
        target.write(chunk)
    return total


#: Levels a record adds around a state (a snapshot's data, a delta's op and its path).
RECORD_ROOM = 4


def _parse(number: int, raw: bytes) -> Any:
    """A line's record, read by the one JSON policy (agentrun.security.storable): its
    numbers, its text, and its depth: at most a whole state's and RECORD_ROOM more. A
    line no export could have written is refused here, naming it, before any of it is
    hashed, patched or stored."""
    try:
        record = storable.loads(raw)
    except RecursionError:
        raise ArchiveError(f"line {number}: nests too deeply to be read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"line {number}: not JSON ({exc})") from None
    depth = storable.max_depth(state=True) + RECORD_ROOM
    problem = storable.problem(record, depth=depth, text=True)
    if problem:
        raise ArchiveError(f"line {number}: {problem}")
    return record


def _records(stream: IO[bytes], sha: Any = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) up to the trailer, whose line count and digest are checked."""
    digest = hashlib.sha256()
    ended = False
    for number, raw in read_lines(stream, sha):
        if ended:
            raise ArchiveError(f"line {number}: the archive goes on after its end line")
        record = _parse(number, raw)
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            raise ArchiveError(f"line {number}: a record must be a JSON object with a type")
        if record["type"] == "end":
            if record.get("lines") != number - 1 or record.get("sha256") != digest.hexdigest():
                raise ArchiveError(
                    "the archive's digest doesn't match its content: it was changed or damaged"
                )
            ended = True
            continue
        digest.update(raw + b"\n")
        yield number, record
    if not ended:
        raise ArchiveError("the archive is truncated: its end line is missing")


# --- checking and building rows --------------------------------------------------------------


_REQUIRED = object()
#: Fields added after the format's first version: an archive from before them imports
#: with their defaults (no code version, no cached tokens or cost recorded, no trace of a
#: request that started it).
_ADDED_LATER = frozenset(
    {
        "created_version",
        "target_version",
        "code_version",
        "tokens_cached",
        "cost_usd",
        "trace_parent",
        "checkpoint",
    }
)


@dataclass(frozen=True)
class _Column:
    """What a record's member must be to go into a field: checked once per value."""

    name: str
    kind: str  # datetime, bool, int, float, text or json
    null: bool
    max_length: int | None
    choices: frozenset[str] | None
    # A member that archives written before the field existed lack: its default then.
    missing: Any = _REQUIRED

    @classmethod
    def of(cls, f: Any) -> _Column:
        if isinstance(f, models.DateTimeField):
            kind = "datetime"
        elif isinstance(f, models.BooleanField):
            kind = "bool"
        elif isinstance(f, models.IntegerField):
            kind = "int"
        elif isinstance(f, models.FloatField):
            kind = "float"
        elif isinstance(f, models.CharField | models.TextField) and not hasattr(f, "from_db_value"):
            kind = "text"
        elif isinstance(f, HashField):
            kind = "hash"
        else:
            kind = "json"
        choices = frozenset(str(c[0]) for c in f.flatchoices) if f.choices else None
        missing = f.get_default() if f.name in _ADDED_LATER else _REQUIRED
        return cls(f.name, kind, f.null, getattr(f, "max_length", None), choices, missing)

    def value(self, value: Any, where: str) -> Any:
        """The record's value as the field stores it, or ArchiveError."""
        if value is None:
            if self.null:
                return None
            raise ArchiveError(f"{where}: {self.name} can't be null")
        kind = self.kind
        if kind == "datetime":
            return self._datetime(value, where)
        if kind == "int":
            ok = type(value) is int and -(2**31) <= value < 2**31
        elif kind == "text":
            ok = type(value) is str and "\x00" not in value
            if ok and self.max_length is not None and len(value) > self.max_length:
                raise ArchiveError(
                    f"{where}: {self.name} is longer than {self.max_length} characters"
                )
        elif kind == "hash":  # hex text, stored as its bytes
            ok = type(value) is str and _HEX.fullmatch(value) is not None
        elif kind == "bool":
            ok = type(value) is bool
        elif kind == "float":
            ok = type(value) in (int, float)
        else:
            ok = True
        if not ok:
            raise ArchiveError(f"{where}: {self.name} has the wrong type ({type(value).__name__})")
        if self.choices is not None and value not in self.choices:
            raise ArchiveError(f"{where}: unknown {self.name} {value!r}")
        return value

    def _datetime(self, value: Any, where: str) -> datetime:
        if not isinstance(value, str):
            raise ArchiveError(f"{where}: {self.name} must be a date-time string")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ArchiveError(f"{where}: {self.name} is not a date-time: {value!r}") from None
        if parsed.tzinfo is None:
            raise ArchiveError(f"{where}: {self.name} has no time zone")
        return parsed


_COLUMNS: dict[int, list[_Column]] = {}


def _values(fields: list[Any], record: dict[str, Any], where: str) -> list[Any]:
    """The record's values of `fields`, in their order, checked."""
    columns = _COLUMNS.get(id(fields))
    if columns is None:
        columns = _COLUMNS[id(fields)] = [_Column.of(f) for f in fields]
    values = []
    for column in columns:
        try:
            value = record[column.name]
        except KeyError:
            if column.missing is _REQUIRED:
                raise ArchiveError(f"{where}: {column.name} is missing") from None
            values.append(column.missing)
            continue
        values.append(column.value(value, where))
    return values


def _build(model: type[models.Model], fields: list[Any], record: dict, where: str, **links: Any):
    """An unsaved row from a record: `fields` from it, the links (run_id=...) given."""
    values = dict(zip((f.attname for f in fields), _values(fields, record, where), strict=True))
    if model is Run:
        return Run(**values, **links)
    # Positional: a tenth of the keyword path's cost, for thousands of rows.
    return model(
        *[
            links[f.attname]
            if f.attname in links
            else values[f.attname]
            if f.attname in values
            else f.get_default()
            for f in model._meta.concrete_fields
        ]
    )


def _source_seq(source: Any, where: str) -> int:
    """The position of a fork's source snapshot, from the record's forked_from."""
    if (
        not isinstance(source, dict)
        or source.get("at") not in ("pre", "post")
        or not isinstance(source.get("step"), int)
        or isinstance(source.get("step"), bool)
        or not 0 <= source["step"] < 2**30
    ):
        raise ArchiveError(f"{where}: forked_from must name a step and pre or post")
    return Snapshot.seq_for(source["step"], source["at"])


def _uuid(value: Any, where: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ArchiveError(f"{where}: {value!r} is not a run id") from None


@dataclass
class _RunCheck:
    """What pass one knows of a run while its records go by."""

    summary: dict[str, Any]
    record: dict[str, Any] | None = None
    seq: int = -1
    state: Any = None
    node: hashing.Node | None = None
    steps: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(
        default_factory=lambda: {"snapshots": 0, "steps": 0, "tool_calls": 0, "events": 0}
    )


@dataclass
class Checked:
    """The outcome of pass one: what will be imported."""

    manifest: dict[str, Any]
    runs: list[str]
    sha256: str
    snapshots: int = 0
    steps: int = 0
    # A keyframe's index of paths, made from the state before it: (run, seq) -> paths.
    keyframe_paths: dict[tuple[str, int], str] = field(default_factory=dict)


def _check_manifest(record: dict[str, Any]) -> dict[str, Any]:
    if record.get("type") != "manifest" or record.get("format") != FORMAT:
        raise ArchiveError("not an agentrun archive: its first line is no agentrun manifest")
    got = record.get("format_version")
    if got != FORMAT_VERSION:
        raise ArchiveError(
            f"unknown archive format version {got!r}: this agentrun reads version {FORMAT_VERSION}"
        )
    schema = record.get("state_schema_version")
    if not isinstance(schema, int) or not 0 <= schema <= SCHEMA_VERSION:
        raise ArchiveError(
            f"the archive's state schema version is {schema!r}; this agentrun reads "
            f"0 to {SCHEMA_VERSION}"
        )
    runs = record.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ArchiveError("the manifest lists no runs")
    ids = [r.get("id") for r in runs]
    if not all(isinstance(i, str) and str(_uuid(i, "manifest")) == i for i in ids):
        raise ArchiveError("the manifest's run ids must be UUIDs in their canonical form")
    if len(set(ids)) != len(ids) or record.get("run") != ids[-1]:
        raise ArchiveError("the manifest's runs are inconsistent")
    existing = list(Run.objects.filter(pk__in=ids).values_list("pk", flat=True))
    if existing:
        raise ArchiveError(
            f"run {existing[0]} already exists here "
            "(an archive imports once: delete that run first to import it again)",
            409,
        )
    return record


def _check_labels(record: dict[str, Any], where: str) -> None:
    """A run record's labels, by the rules of a run's start (agentrun.lifecycle.labels);
    `forked-from` only on a fork, naming its parent, as agentrun sets it."""
    labels = record.get("labels", {})
    if not isinstance(labels, dict):
        raise ArchiveError(f"{where}: labels must map keys to values (text)")
    own = dict(labels)
    forked_from = own.pop(run_labels.FORKED_FROM, None)
    parent = record.get("parent")
    if forked_from is not None and not (isinstance(parent, str) and forked_from == parent[:8]):
        raise ArchiveError(
            f"{where}: label {run_labels.FORKED_FROM!r} is reserved: agentrun sets it on a "
            "fork, to its parent's short id"
        )
    try:
        run_labels.check(own)
    except run_labels.InvalidLabels as exc:
        raise ArchiveError(f"{where}: {exc}") from None


def _ops_problem(ops: Any) -> str | None:
    """Why a delta's ops could build a state deeper than a state may be, or None: each op's
    path and the depth of what it puts there stay within the limit."""
    if not isinstance(ops, list):
        return None  # (the delta's own checks say what is wrong with it)
    limit = storable.max_depth(state=True)
    for i, op in enumerate(ops):
        if not (isinstance(op, list) and len(op) >= 2 and isinstance(op[1], list)):
            continue
        room = limit - len(op[1])
        if room < 0:
            return f"op {i}'s path is {len(op[1])} levels deep; a state nests at most {limit}"
        values = op[2:3] if op[0] == "set" else op[4:5] if op[0] == "splice" else []
        for value in values:
            problem = storable.shape_problem(value, depth=room + (op[0] == "splice"))
            if problem:
                return f"op {i} would nest the state deeper than {limit} levels"
    return None


class _Checker:
    """Pass one: every record checked, every snapshot's state rebuilt and hashed."""

    def __init__(self, manifest: dict[str, Any]):
        self.manifest = manifest
        self.runs = {str(r["id"]): _RunCheck(r) for r in manifest["runs"]}
        self.order = list(self.runs)
        self.current: _RunCheck | None = None
        # Fork sources inside the archive: (run, seq) -> (state, node), kept as they pass.
        self.sources: dict[tuple[str, int], tuple[Any, hashing.Node]] = {}
        self.wanted: set[tuple[str, int]] = set()
        self.keyframe_paths: dict[tuple[str, int], str] = {}

    def record(self, number: int, record: dict[str, Any]) -> None:
        kind = record["type"]
        where = f"line {number} ({kind})"
        if kind == "run":
            self._run(record, where)
            return
        run = self.current
        if run is None or record.get("run") != run.summary["id"]:
            raise ArchiveError(f"{where}: it belongs to no run record before it")
        if kind == "snapshot":
            self._snapshot(run, record, where)
        elif kind == "step":
            _values(STEP_FIELDS, record, where)
            if record["number"] in run.steps:
                raise ArchiveError(f"{where}: step {record['number']} comes twice")
            run.steps.add(record["number"])
        elif kind == "tool_call":
            _values(TOOL_CALL_FIELDS, record, where)
            if record.get("step") not in run.steps:
                raise ArchiveError(f"{where}: its step {record.get('step')!r} is not in the run")
        elif kind == "event":
            _values(EVENT_FIELDS, record, where)
        else:
            raise ArchiveError(f"{where}: unknown record type {kind!r}")
        run.counts[kind + "s"] += 1

    def _run(self, record: dict[str, Any], where: str) -> None:
        self._finish()
        run_id = str(_uuid(record.get("id"), where))
        if run_id not in self.runs or self.runs[run_id].record is not None:
            raise ArchiveError(f"{where}: run {run_id} is not in the manifest, or comes twice")
        expected = self.order[len([r for r in self.runs.values() if r.record is not None])]
        if run_id != expected:
            raise ArchiveError(f"{where}: runs come in the manifest's order")
        run = self.runs[run_id]
        _values(RUN_FIELDS, record, where)
        parent, source = record.get("parent"), record.get("forked_from")
        if not isinstance(record.get("parent_in_archive"), bool):
            raise ArchiveError(f"{where}: parent_in_archive must be true or false")
        if not (parent is None or isinstance(parent, str)):
            raise ArchiveError(f"{where}: parent must be a run id or null")
        if record["parent_in_archive"]:
            if parent not in self.runs or self.runs[parent].record is None:
                raise ArchiveError(f"{where}: its parent {parent!r} comes after it or not at all")
            seq = _source_seq(source, where)
            if (parent, seq) not in self.sources:
                raise ArchiveError(f"{where}: its fork source is not in its parent's snapshots")
        _check_labels(record, where)
        # A run's input, as start_run takes it: what an export wrote passed that door.
        problem = storable.problem(record.get("input"), text=True, what="input")
        if problem:
            raise ArchiveError(f"{where}: {problem}")
        run.record = record
        self.current = run
        for other in self.manifest["runs"]:
            src = other.get("forked_from")
            if other.get("parent") == run_id and other.get("parent_in_archive") and src:
                self.wanted.add((run_id, _source_seq(src, "manifest")))

    def _snapshot(self, run: _RunCheck, record: dict[str, Any], where: str) -> None:
        snap = _build(Snapshot, SNAPSHOT_FIELDS, record, where)
        if snap.seq != Snapshot.seq_for(snap.step, snap.at) or snap.seq <= run.seq:
            raise ArchiveError(f"{where}: snapshots must come in order, one per position")
        try:
            state, node = self._state(run, snap, where)
        except ArchiveError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ArchiveError(f"{where}: its delta doesn't apply: {exc}") from None
        if node.hex != snap.hash or node.size != snap.size:
            raise ArchiveError(
                f"{where}: the state of the {snap.at} snapshot of step {snap.step} of run "
                f"{run.summary['id']} doesn't match its hash: the archive was changed or damaged"
            )
        if snap.kind == SnapshotKind.FULL:
            # What the keyframe's step changed, as snapshots.encode indexes it: no hash
            # covers the archive's own index of paths.
            self.keyframe_paths[(run.summary["id"], snap.seq)] = (
                snapshots.WHOLE if run.node is None else touched_paths(delta.diff(run.state, state))
            )
        run.seq, run.state, run.node = snap.seq, state, node
        key = (run.summary["id"], snap.seq)
        if key in self.wanted:
            self.sources[key] = (state, node)

    def _state(self, run: _RunCheck, snap: Snapshot, where: str) -> tuple[Any, hashing.Node]:
        if snap.kind != SnapshotKind.FULL:
            problem = _ops_problem(snap.data)
            if problem:
                raise ArchiveError(f"{where}: {problem}")
        else:
            problem = storable.problem(snap.data, depth=storable.max_depth(state=True))
            if problem:
                raise ArchiveError(f"{where}: the keyframe's state: {problem}")
        if snap.kind == SnapshotKind.FULL:
            if not isinstance(snap.data, dict):
                raise ArchiveError(f"{where}: a keyframe's data must be a JSON object")
            return snap.data, hashing.build(snap.data)
        if snap.kind == SnapshotKind.FORK:
            record = run.record or {}
            if not record.get("parent_in_archive") or run.seq >= 0:
                raise ArchiveError(f"{where}: a fork reference whose source is not in the archive")
            key = (record.get("parent"), _source_seq(record.get("forked_from"), where))
            if key not in self.sources:
                raise ArchiveError(f"{where}: a fork reference whose source is not in the archive")
            state, node = self.sources[key]
            if snap.data:
                return delta.patch(state, snap.data), hashing.apply(node, snap.data)
            return state, node
        if run.node is None:
            raise ArchiveError(f"{where}: a {snap.kind} snapshot with nothing before it")
        if snap.kind == SnapshotKind.REF:
            return run.state, run.node
        if not isinstance(snap.data, list):
            raise ArchiveError(f"{where}: a delta's data must be a list of operations")
        return delta.patch(run.state, snap.data), hashing.apply(run.node, snap.data)

    def _finish(self) -> None:
        run = self.current
        if run is None:
            return
        summary = run.summary
        for name, got in run.counts.items():
            if summary.get(name) != got:
                raise ArchiveError(
                    f"run {summary['id']}: the manifest says {summary.get(name)!r} {name}, "
                    f"the archive holds {got}: it is incomplete or was changed"
                )
        if run.node is not None and summary.get("last_hash") != run.node.hex:
            raise ArchiveError(f"run {summary['id']}: its last snapshot is not the manifest's")
        run.state = run.node = None  # only fork sources stay in memory

    def done(self) -> None:
        self._finish()
        missing = [r for r, c in self.runs.items() if c.record is None]
        if missing:
            raise ArchiveError(f"run {missing[0]} is in the manifest but not in the archive")


def check(stream: IO[bytes]) -> Checked:
    """Pass one: the whole archive checked, nothing written. ArchiveError if it is bad."""
    sha = hashlib.sha256()
    checker: _Checker | None = None
    for number, record in _records(stream, sha):
        if checker is None:
            checker = _Checker(_check_manifest(record))
            continue
        checker.record(number, record)
    if checker is None:
        raise ArchiveError("the archive holds no manifest")
    checker.done()
    counts = [c.counts for c in checker.runs.values()]
    return Checked(
        manifest=checker.manifest,
        runs=checker.order,
        sha256=sha.hexdigest(),
        snapshots=sum(c["snapshots"] for c in counts),
        steps=sum(c["steps"] for c in counts),
        keyframe_paths=checker.keyframe_paths,
    )


# --- writing ---------------------------------------------------------------------------------

BATCH = 500


class _Writer:
    """Pass two: rows built from the records and bulk-inserted, in the archive's order."""

    def __init__(self, checked: Checked, user: Any):
        self.checked = checked
        self.user = user
        self.now = timezone.now()
        self.pending: list[models.Model] = []
        self.run: Run | None = None
        self.step_ids: dict[int, int] = {}

    def record(self, number: int, record: dict[str, Any]) -> None:
        kind = record["type"]
        where = f"line {number} ({kind})"
        if self.pending and type(self.pending[0]) is not _MODELS.get(kind):
            self.flush()
        if kind == "manifest":
            return
        if kind == "run":
            self.run = self._create_run(record, where)
            return
        run_id = self.run.pk if self.run else None
        if kind == "snapshot":
            snap = _build(Snapshot, SNAPSHOT_FIELDS, record, where, run_id=run_id)
            # The index of what a change touched is derived, and no hash covers it: made
            # again from the ops (a keyframe's in pass one), so an archive can't hide a
            # change from a watch.
            if snap.kind in (SnapshotKind.DELTA, SnapshotKind.FORK) and isinstance(snap.data, list):
                snap.paths = touched_paths(snap.data)
            elif snap.kind == SnapshotKind.FULL:
                key = (str(run_id), snap.seq)
                snap.paths = self.checked.keyframe_paths.get(key, snap.paths)
            self.pending.append(snap)
        elif kind == "step":
            step = _build(Step, STEP_FIELDS, record, where, run_id=run_id)
            if step.checkpoint is None and isinstance(step.decision, dict):
                # A LangGraph step exported before its record had a column of its own.
                step.checkpoint = checkpoints.moved_out(step.decision)
            self.pending.append(step)
        elif kind == "tool_call":
            if not self.step_ids:
                self.step_ids = dict(Step.objects.filter(run_id=run_id).values_list("number", "pk"))
            self.pending.append(
                _build(
                    ToolCall,
                    TOOL_CALL_FIELDS,
                    record,
                    where,
                    run_id=run_id,
                    step_id=self.step_ids[record["step"]],
                )
            )
        elif kind == "event":
            self.pending.append(_build(Event, EVENT_FIELDS, record, where, run_id=run_id))
        if len(self.pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            type(self.pending[0]).objects.bulk_create(self.pending, batch_size=BATCH)
            self.pending = []

    def _create_run(self, record: dict[str, Any], where: str) -> Run:
        self.flush()
        self.step_ids = {}
        run = _build(Run, RUN_FIELDS, record, where, id=uuid.UUID(record["id"]))
        source = record.get("forked_from")
        if record.get("parent_in_archive"):
            run.parent_id = uuid.UUID(record["parent"])
            run.forked_from = Snapshot.objects.get(
                run_id=run.parent_id, seq=Snapshot.seq_for(source["step"], source["at"])
            )
        manifest = self.checked.manifest
        run.imported_at = self.now
        run.imported = {
            "by": self.user.get_username() if self.user is not None else None,
            "exported_at": manifest.get("exported_at"),
            "exported_by": manifest.get("exported_by"),
            "source_host": manifest.get("source_host"),
            "agentrun_version": manifest.get("agentrun_version"),
            "archive_sha256": self.checked.sha256,
            "created_by": record.get("created_by"),
            # A parent the archive doesn't hold: known by id only.
            "parent": None if record.get("parent_in_archive") else record.get("parent"),
            "forked_from": None if record.get("parent_in_archive") else source,
            "lineage": [n for n in manifest.get("lineage") or [] if isinstance(n, dict)],
        }
        run.save(force_insert=True)
        RunLabel.objects.bulk_create(
            RunLabel(run=run, key=k, value=v) for k, v in (record.get("labels") or {}).items()
        )
        return run


_MODELS: dict[str, type[models.Model]] = {
    "snapshot": Snapshot,
    "step": Step,
    "tool_call": ToolCall,
    "event": Event,
}


def import_archive(open_stream: Any, *, user: Any = None) -> list[Run]:
    """Check the archive, then store its runs, read-only, in one transaction.

    `open_stream()` opens the archive from its start (it is read twice). Returns the
    runs, the exported one last. ArchiveError (nothing stored) if anything is wrong.
    """
    with open_stream() as stream:
        checked = check(stream)
    sha = hashlib.sha256()
    try:
        with transaction.atomic():
            writer = _Writer(checked, user)
            with open_stream() as stream:
                for number, record in _records(stream, sha):
                    writer.record(number, record)
            writer.flush()
            if sha.hexdigest() != checked.sha256:
                raise ArchiveError("the archive changed while it was being imported")
            from agentrun.audit.events import record_event

            root = Run.objects.get(pk=checked.runs[-1])
            record_event(
                "run_imported",
                run=root,
                user=user,
                payload={
                    "runs": checked.runs,
                    "archive_sha256": checked.sha256,
                    "exported_at": checked.manifest.get("exported_at"),
                    "source_host": checked.manifest.get("source_host"),
                },
            )
    except DatabaseError as exc:
        raise ArchiveError(f"the archive's rows can't be stored here: {exc}") from None
    except ArchiveError:
        raise
    except (KeyError, TypeError, ValueError, Snapshot.DoesNotExist) as exc:
        # Only a file changed between the two passes gets past the first one's checks.
        raise ArchiveError(f"the archive changed while it was being imported ({exc!r})") from None
    found = Run.objects.in_bulk([uuid.UUID(r) for r in checked.runs])
    return [found[uuid.UUID(r)] for r in checked.runs]
