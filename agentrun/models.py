"""The truth about every run lives in these tables.

Status changes that race (claim, commit, cancel) are conditional UPDATEs:
`Run.objects.filter(pk=..., next_step=n, lease_owner=me).update(...) == 1`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

_isal_zlib: Any
try:  # ISA-L's inflate (the isal package): zlib's streams, faster; see _decompress
    from isal import isal_zlib as _isal_zlib
except ImportError:  # no wheel for this platform: zlib does the same work
    _isal_zlib = None


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING)
TERMINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)


class WaitReason(models.TextChoices):
    NONE = ""
    APPROVAL = "approval"
    IN_DOUBT = "in_doubt"
    BACKOFF = "backoff"
    # A step that kept crashing (AGENTRUN_MAX_STEP_ATTEMPTS): an operator retries it.
    CRASHED = "crashed"


class ReplayMode(models.TextChoices):
    NORMAL = ""
    SANDBOX = "sandbox"
    RECORDED = "recorded"
    LIVE = "live"


class RunQuerySet(models.QuerySet["Run"]):
    def active(self) -> RunQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def runnable(self, now: datetime) -> RunQuerySet:
        """Runs a worker could claim right now: not parked, not leased, due."""
        return self.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now),
            Q(wake_at__isnull=True) | Q(wake_at__lte=now),
        )

    def due_backoff(self, now: datetime) -> RunQuerySet:
        return self.filter(
            status=RunStatus.WAITING, wait_reason=WaitReason.BACKOFF, wake_at__lte=now
        )


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100)
    agent_version = models.CharField(max_length=64, blank=True)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    wait_reason = models.CharField(max_length=16, choices=WaitReason.choices, blank=True)
    phase = models.CharField(max_length=16, default="idle")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks"
    )
    forked_from = models.ForeignKey(
        "Snapshot", null=True, blank=True, on_delete=models.PROTECT, related_name="forks"
    )
    mode = models.CharField(max_length=16, choices=ReplayMode.choices, blank=True)
    # Recorded replay: the first step where the fork's state stopped matching its parent's.
    divergence_step = models.IntegerField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    first_step = models.IntegerField(default=1)
    next_step = models.IntegerField(default=1)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # When a parked (backoff) run is due again. Lives here, not in a Celery countdown.
    wake_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    final_answer = models.TextField(blank=True)
    tokens_in = models.IntegerField(default=0)
    tokens_out = models.IntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Retention (agentrun.retention): a pinned run, its fork ancestors and descendants
    # are never purged. A purged run keeps this row, its events and its side-effecting
    # tool calls; purged_at is set when the purge takes the run, purge_done when its
    # steps, snapshots and read calls are all gone.
    pinned_at = models.DateTimeField(null=True, blank=True)
    pinned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pin_reason = models.TextField(blank=True)
    purged_at = models.DateTimeField(null=True, blank=True)
    purge_done = models.BooleanField(default=False)
    # Imported from an archive (agentrun.archive): read-only here, never resumed or
    # reconciled; `imported` says from where (source, exporter, archive digest, lineage).
    imported_at = models.DateTimeField(null=True, blank=True)
    imported = models.JSONField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The run list: newest first, optionally by status. Also the reconciler's and
            # runnable()'s way in: active runs are few, their lease and wake-up are checked
            # on the rows. No index holds lease_expires_at, next_step or updated_at, so the
            # two updates per step (claim, commit) are HOT: no new index entries, and the
            # table's fillfactor (migration 0007) leaves room on the page for them.
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_created"),
            # The purge's candidates: finished, not purged, not pinned, oldest first. Each
            # column in it changes once in a run's life, so step updates stay HOT.
            models.Index(
                fields=["finished_at"],
                condition=Q(
                    finished_at__isnull=False, purged_at__isnull=True, pinned_at__isnull=True
                ),
                name="run_purge_candidates",
            ),
            # The run list's pinned filter (?pinned=1), newest first.
            models.Index(
                fields=["-created_at"], condition=Q(pinned_at__isnull=False), name="run_pinned"
            ),
            # A purge interrupted half-way: the next pass finishes it.
            models.Index(
                fields=["purged_at"],
                condition=Q(purged_at__isnull=False, purge_done=False),
                name="run_purging",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.id}"

    @property
    def is_active(self) -> bool:
        """Might still change: an imported run never does, whatever its status says."""
        return self.status in ACTIVE_STATUSES and self.imported_at is None

    @property
    def is_imported(self) -> bool:
        return self.imported_at is not None

    def ended_with(self, steps: int) -> bool:
        """Ended (not queued, running or waiting), not purged, and at least `steps` steps
        long (0: never): a run that gets its derived data (search index, regrouping)."""
        return (
            steps > 0
            and self.status not in ACTIVE_STATUSES
            and self.purged_at is None
            and self.next_step - self.first_step >= steps
        )

    @property
    def import_info(self) -> dict[str, Any]:
        """Where an imported run came from, its times parsed (for pages)."""
        info = dict(self.imported or {})
        if isinstance(info.get("exported_at"), str):
            with contextlib.suppress(ValueError):
                info["exported_at"] = datetime.fromisoformat(info["exported_at"])
        return info

    @property
    def is_pinned(self) -> bool:
        return self.pinned_at is not None

    @property
    def is_purged(self) -> bool:
        return self.purged_at is not None

    @property
    def is_fork(self) -> bool:
        return self.parent_id is not None

    @property
    def duration(self) -> timedelta | None:
        if not self.started_at:
            return None
        return (self.finished_at or timezone.now()) - self.started_at

    @property
    def steps_done(self) -> int:
        return self.next_step - self.first_step

    def lineage(self) -> list[Run]:
        """The parent chain, oldest first, ending with this run."""
        chain = [self]
        seen = {self.pk}
        while chain[0].parent_id and chain[0].parent_id not in seen:
            parent = Run.objects.get(pk=chain[0].parent_id)
            seen.add(parent.pk)
            chain.insert(0, parent)
        return chain


class RunLabel(models.Model):
    """One `key=value` label of a run (agentrun.labels holds the rules). Set at the start."""

    # No index of its own: runlabel_run_key starts with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="labels", db_index=False)
    key = models.CharField(max_length=63)
    value = models.CharField(max_length=200)

    class Meta:
        ordering = ["run", "key"]
        constraints = [
            # A run has each key once; also the way from a run to its labels (the pages).
            models.UniqueConstraint(fields=["run", "key"], name="runlabel_run_key"),
        ]
        indexes = [
            # The run list's ?label=key=value (and ?label=key): the runs with that label.
            models.Index(fields=["key", "value"], name="runlabel_key_value"),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class StepStatus(models.TextChoices):
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Step(models.Model):
    # No index of its own: step_run_number starts with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    number = models.IntegerField()
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.RUNNING)
    attempts = models.IntegerField(default=0)
    # Attempts that ended without an outcome: an exception outside a tool, or the worker
    # died or lost its lease mid-step. Counted at the next claim, so a kill counts too.
    crashes = models.IntegerField(default=0)
    # One entry per crash: when, which worker (lease owner), and what is known of it.
    crash_log = models.JSONField(default=list, blank=True)
    # The lease owner of the current (or last) attempt.
    worker = models.CharField(max_length=100, blank=True)
    phase_before = models.CharField(max_length=16, blank=True)
    phase_after = models.CharField(max_length=16, blank=True)
    # thought, rationale, calls | final; for LLM agents also the raw request/response.
    decision = models.JSONField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_count = models.IntegerField(default=0)
    failure = models.JSONField(null=True, blank=True)
    tokens_in = models.IntegerField(default=0)
    tokens_out = models.IntegerField(default=0)
    llm_latency_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    state_size = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="step_run_number")]
        indexes = [
            # The run list's "succeeded after retries": does a run have a step that crashed?
            # Holds the few crashed steps only; a step's usual updates leave it alone.
            models.Index(fields=["run"], condition=Q(crashes__gt=0), name="step_crashed"),
        ]

    def __str__(self) -> str:
        return f"step {self.number} of {self.run_id}"

    @property
    def thought(self) -> str:
        return (self.decision or {}).get("thought", "")

    @property
    def rationale(self) -> str:
        return (self.decision or {}).get("rationale", "")


class JSONText(models.TextField):
    """JSON stored as text, read back exactly as written.

    jsonb would rewrite numbers (1e16 comes back as an int, -0.0 as 0) and
    parse every keyframe on insert; snapshots must round-trip exactly.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(value)

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else json_text(value)


def json_text(value: Any) -> str:
    """Compact JSON, as the JSON columns store it; a lone surrogate (not UTF-8 encodable) is kept as a \\u escape."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


class Prepared(bytes):
    """A compressed column value computed already: stored as it is."""


# A value packed against another snapshot's JSON text, as zlib's preset dictionary:
# - a read call's result against its step's post delta, which holds the same text once
#   the agent has put the result in its state: the result costs what the delta lacks;
# - a delta against the end of its keyframe's text, which the reads of the delta read
#   first anyway: the run's own words, names and keys are then cheap to repeat.
# Its bytes: a mark, the run's id (16 bytes), the seq of the run's snapshot whose data is
# the dictionary (4 bytes, big-endian), then a zlib stream whose header holds the
# dictionary's checksum. The mark says how much of the text's end is the dictionary:
# FULL_WINDOW (zlib looks back 32 KiB at most), or SHORT_WINDOW, which deltas were packed
# with before a replay set each dictionary once (Inflater): the full one stores a tenth
# less. A zlib stream never starts with a mark (its first byte has 8 in its low bits).
FULL_WINDOW, SHORT_WINDOW = 32 * 1024, 8 * 1024
_WINDOWS = {b"\x01": FULL_WINDOW, b"\x02": SHORT_WINDOW}
_MARKS = {size: mark for mark, size in _WINDOWS.items()}
PACKED = 0x01  # the mark of a result (FULL_WINDOW)
_LOCATOR = 1 + 16 + 4

# The last FULL_WINDOW bytes of recently used dictionaries, by locator (run id bytes + seq).
# Snapshots never change; a run deleted and imported again under its id may hold other
# text, which the stream's checksum catches: then the dictionary is read again (inflate).
# Bounded by their bytes, not their number: a worker with a thousand small runs in flight
# keeps each one's keyframe tail, and a few big ones don't crowd out the memory.
_TAILS: OrderedDict[bytes, bytes] = OrderedDict()
_TAILS_MAX_BYTES = 16 * 1024 * 1024
_TAILS_BYTES = 0
_TAILS_LOCK = threading.Lock()


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _key(run_id: Any, seq: int) -> bytes:
    return _uuid(run_id).bytes + seq.to_bytes(4, "big")


def dictionary_key(run_id: Any, seq: int) -> bytes:
    """The locator of snapshot `seq` of `run_id`, as a packed value names its dictionary."""
    return _key(run_id, seq)


def packed_against(blob: bytes, run_id: Any) -> int | None:
    """The seq of the snapshot of `run_id` that a stored value is packed against, or None
    (compressed alone, or packed against another run's snapshot)."""
    if blob[:1] not in _WINDOWS or blob[1:17] != _uuid(run_id).bytes:
        return None
    return int.from_bytes(blob[17:_LOCATOR], "big")


def remember_dictionary(run_id: Any, seq: int, text: bytes) -> None:
    """Keep the text of a snapshot this process has just committed (or read)."""
    global _TAILS_BYTES
    key = _key(run_id, seq)
    tail = text[-FULL_WINDOW:]
    with _TAILS_LOCK:
        _TAILS_BYTES += len(tail) - len(_TAILS.pop(key, b""))
        _TAILS[key] = tail
        while _TAILS_BYTES > _TAILS_MAX_BYTES and _TAILS:
            _TAILS_BYTES -= len(_TAILS.popitem(last=False)[1])


def forget_dictionaries() -> None:
    """Empty this process's dictionaries (as in another process: tests)."""
    global _TAILS_BYTES
    with _TAILS_LOCK:
        _TAILS.clear()
        _TAILS_BYTES = 0


def forget_dictionary(key: bytes) -> None:
    global _TAILS_BYTES
    with _TAILS_LOCK:
        _TAILS_BYTES -= len(_TAILS.pop(key, b""))


def remembered_dictionary(run_id: Any, seq: int) -> bytes | None:
    """The text tail of a snapshot if this process has it in memory; never a query."""
    return _TAILS.get(_key(run_id, seq))


#: Texts shorter than this are compressed alone too, whenever packing gained less than 4x.
_PLAIN_TRIED = 1024


def pack_text(
    text: bytes, run_id: Any, seq: int, zdict: bytes, window: int = FULL_WINDOW
) -> Prepared:
    """JSON `text` compressed against the last `window` bytes of `zdict`, the text of
    snapshot `seq` of `run_id` (or compressed alone, when that comes out smaller)."""
    z = zlib.compressobj(CompressedJSONField.level, zdict=zdict[-window:])
    body = z.compress(text) + z.flush()
    if len(body) * 4 > len(text) and (len(text) < _PLAIN_TRIED or len(body) * 2 > len(text)):
        # The dictionary may have held little of it: compressed alone, is it as short?
        # Beyond a few hundred bytes, only when the text barely compressed: a text of
        # words packed 2-4x is one the dictionary helped more than the locator costs
        # (never once plain in bench's 2,000 steps of deltas, each tried; the second
        # compression was 6% of a step's instructions).
        plain = zlib.compress(text, CompressedJSONField.level)
        if len(plain) <= len(body) + _LOCATOR:
            return Prepared(plain)
    return Prepared(_MARKS[window] + _key(run_id, seq) + body)


def pack(value: Any, run_id: Any, seq: int, zdict: bytes) -> Prepared:
    """pack_text for a JSON value."""
    return pack_text(json_text(value).encode(), run_id, seq, zdict)


def _stored(keys: set[bytes]) -> Iterator[tuple[uuid.UUID, list[tuple[int, bytes]]]]:
    """The stored values of the snapshots these locators name, one query per run:
    (run id, [(seq, value)]); a snapshot that is gone (or holds no data) is left out."""
    by_run: dict[bytes, list[int]] = {}
    for key in keys:
        by_run.setdefault(key[:16], []).append(int.from_bytes(key[16:], "big"))
    raw = models.ExpressionWrapper(models.F("data"), output_field=models.BinaryField())
    for run_bytes, seqs in by_run.items():
        run_id = uuid.UUID(bytes=run_bytes)
        rows = Snapshot.objects.filter(run_id=run_id, seq__in=seqs).values_list("seq", raw)
        yield run_id, [(seq, bytes(data)) for seq, data in rows if data is not None]


def dictionaries(wanted: set[bytes]) -> dict[bytes, bytes]:
    """The (last FULL_WINDOW bytes of the) JSON text of these snapshots, by locator
    (`_key`), from memory or one query per run; a snapshot that is gone is left out."""
    found = {k: t for k in wanted if (t := _TAILS.get(k)) is not None}
    for run_id, rows in _stored(wanted - found.keys()):
        # Deltas are packed against their keyframe: those in one query too, not one each;
        # and so are the holders of regrouped ones.
        inner = {data[1:_LOCATOR] for _, data in rows if data[:1] in _WINDOWS}
        zdicts = dictionaries(inner) if inner else None
        groups = groups_of([data for _, data in rows])
        for seq, data in rows:
            text = inflate(data, zdicts, groups)
            remember_dictionary(run_id, seq, text)
            found[_key(run_id, seq)] = text[-FULL_WINDOW:]
    return found


def _unpack(blob: bytes, zdict: bytes, window: int) -> bytes | None:
    """The text of a packed value given its dictionary; None if it is not the one."""
    try:
        z = zlib.decompressobj(zdict=zdict if len(zdict) <= window else zdict[-window:])
        text = z.decompress(blob[_LOCATOR:])
    except zlib.error:
        return None
    if not z.eof:
        raise zlib.error("a packed value is truncated")
    return text


def _decompress(blob: bytes) -> bytes:
    """zlib.decompress, by ISA-L when it is installed: it inflates the same stream in
    about half the time (most of a long watch's scan, a whole history's, an export's).
    Errors are zlib's own (a damaged value is then inflated again by zlib to say why).
    A header whose window size zlib refuses (over 32 KiB) goes to zlib: ISA-L ignores it."""
    if _isal_zlib is not None and blob[:1] and blob[0] >> 4 <= 7:
        try:
            return _isal_zlib.decompress(blob)
        except _isal_zlib.error:
            pass
    return zlib.decompress(blob)


# A finished run's deltas regrouped (agentrun.compaction): the texts of consecutive deltas
# in one zlib stream, kept by the first of them (the group's holder), each delta's value
# naming its part. One stream a group instead of one a delta: about a third fewer bytes,
# and a scan of the run inflates a third as long (bench/bench_grouped_deltas.py).
# - the holder: GROUP, the locator of its own row, the head, then the zlib stream;
# - every other member: SLICE, the locator of the holder's row, the head;
# the head is the CRC-32 and the length of the group's text, and where the member's text
# lies in it (start, end); 4 bytes each, big-endian. CRC and length tell a group that is
# not the one a slice was cut from (a run deleted and imported again under its id, and
# regrouped again).
GROUP, SLICE = b"\x04", b"\x03"
_GROUP_HEAD = struct.Struct(">IIII")
GROUP_HEADER = _LOCATOR + _GROUP_HEAD.size

# The text of recently read groups, by locator: (CRC-32, text). Bounded by bytes; a text
# over a quarter of the bound is not kept (a group is cut at GROUP_MAX_BYTES anyway).
_GROUPS: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
_GROUPS_MAX_BYTES = 32 * 1024 * 1024
_GROUPS_BYTES = 0
_GROUPS_LOCK = threading.Lock()


def group_values(run_id: Any, holder_seq: int, texts: list[bytes], level: int) -> list[Prepared]:
    """The stored values of one group of `run_id`'s deltas, whose texts these are, in
    order; the first is the holder, snapshot `holder_seq`."""
    text = b"".join(texts)
    crc, key = zlib.crc32(text), _key(run_id, holder_seq)
    out, at = [], 0
    for part in texts:
        head = key + _GROUP_HEAD.pack(crc, len(text), at, at + len(part))
        out.append(Prepared(SLICE + head) if out else Prepared(GROUP + head))
        at += len(part)
    out[0] = Prepared(out[0] + zlib.compress(text, level))
    return out


def group_parts(values: list[bytes]) -> list[bytes]:
    """The text of each value of one group (the holder first), from these values alone:
    no cache, no query. What a compaction checks before it writes them."""
    holder = values[0]
    if holder[:1] != GROUP:
        raise zlib.error("a group starts with its holder")
    text = _decompress(holder[GROUP_HEADER:])
    crc, size = zlib.crc32(text), len(text)
    out = []
    for i, value in enumerate(values):
        if value[:1] != (GROUP if i == 0 else SLICE) or value[1:_LOCATOR] != holder[1:_LOCATOR]:
            raise zlib.error("a member of a group names another holder")
        head = _GROUP_HEAD.unpack_from(value, _LOCATOR)
        if head[:2] != (crc, size) or not head[2] <= head[3] <= size:
            raise zlib.error("a member of a group doesn't match it")
        out.append(text[head[2] : head[3]])
    return out


#: Group texts at hand, by locator: (CRC-32, text), as `groups_of` returns them.
Groups = dict[bytes, tuple[int, bytes]]


def groups_of(blobs: list[bytes]) -> Groups:
    """The texts of the groups that these stored values are members of, for the members
    whose holder is not among them: from memory, else one query per run. Reading sparse
    members one by one would read each holder in a query of its own (a watch of a value
    that a few steps of a regrouped run changed meets a new group at nearly every one).
    A holder that is gone is left out: reading the member then says so."""
    wanted = {b[1:_LOCATOR] for b in blobs if b[:1] == SLICE}
    if not wanted:
        return {}
    wanted -= {b[1:_LOCATOR] for b in blobs if b[:1] == GROUP}
    out: Groups = {k: found for k in wanted if (found := _GROUPS.get(k)) is not None}
    for run_id, rows in _stored(wanted - out.keys()):
        for seq, holder in rows:
            key = _key(run_id, seq)
            if holder[:1] == GROUP and holder[1:_LOCATOR] == key:
                text = _decompress(holder[GROUP_HEADER:])
                out[key] = (zlib.crc32(text), text)
                _keep_group(key, out[key])
    return out


def _keep_group(key: bytes, found: tuple[int, bytes]) -> None:
    global _GROUPS_BYTES
    if len(found[1]) > _GROUPS_MAX_BYTES // 4:
        return
    with _GROUPS_LOCK:
        _GROUPS_BYTES += len(found[1]) - len(_GROUPS.pop(key, (0, b""))[1])
        _GROUPS[key] = found
        while _GROUPS_BYTES > _GROUPS_MAX_BYTES and _GROUPS:
            _GROUPS_BYTES -= len(_GROUPS.popitem(last=False)[1][1])


def _group_text(
    key: bytes, crc: int, size: int, holder: bytes | None, groups: Groups | None = None
) -> bytes:
    """The text of the group held by the row at locator `key`; `holder`: that row's
    value when the caller has it; `groups`: group texts at hand (else from memory or
    the database)."""
    found = _GROUPS.get(key) if groups is None else groups.get(key) or _GROUPS.get(key)
    if found is not None and found[0] == crc and len(found[1]) == size:
        return found[1]  # (no move to the end: a scan meets a group's members in a row)
    if holder is None:
        run, seq = uuid.UUID(bytes=key[:16]), int.from_bytes(key[16:], "big")
        raw = models.ExpressionWrapper(models.F("data"), output_field=models.BinaryField())
        row = Snapshot.objects.filter(run_id=run, seq=seq).values_list(raw, flat=True).first()
        if row is None or bytes(row[:1]) != GROUP:
            raise ValueError(
                f"a grouped value refers to snapshot {seq} of run {run}, which is gone"
            )
        holder = bytes(row)
    if holder[1:_LOCATOR] != key:
        raise zlib.error("a group's holder names another row")
    text = _decompress(holder[GROUP_HEADER:])
    if zlib.crc32(text) != crc or len(text) != size:
        raise zlib.error("a grouped value doesn't match the group it refers to")
    _keep_group(key, (crc, text))
    return text


def forget_groups() -> None:
    """Empty this process's group texts (as in another process: tests)."""
    global _GROUPS_BYTES
    with _GROUPS_LOCK:
        _GROUPS.clear()
        _GROUPS_BYTES = 0


def _sliced(blob: bytes, groups: Groups | None = None) -> bytes:
    """The text of a grouped value (a holder's or a member's)."""
    if len(blob) < GROUP_HEADER:
        raise zlib.error("a grouped value is truncated")
    crc, size, start, end = _GROUP_HEAD.unpack_from(blob, _LOCATOR)
    if not start <= end <= size:
        raise zlib.error("a grouped value lies outside its group")
    text = _group_text(blob[1:_LOCATOR], crc, size, blob if blob[:1] == GROUP else None, groups)
    return text[start:end]


def is_grouped(blob: bytes) -> bool:
    return blob[:1] in (GROUP, SLICE)


def inflate(
    blob: bytes, zdicts: dict[bytes, bytes] | None = None, groups: Groups | None = None
) -> bytes:
    """The JSON text (UTF-8) of a compressed column's stored bytes; `zdicts` and
    `groups`: dictionaries and group texts at hand (else from memory or the database)."""
    if type(blob) is not bytes:
        blob = bytes(blob)
    window = _WINDOWS.get(blob[:1])
    if window is None:
        return _sliced(blob, groups) if blob[:1] in (GROUP, SLICE) else _decompress(blob)
    key = blob[1:_LOCATOR]
    zdict = (zdicts or _TAILS).get(key)
    text = None if zdict is None else _unpack(blob, zdict, window)
    if text is None:
        # Not at hand, or remembered from a run since deleted: read it (again).
        forget_dictionary(key)
        zdict = dictionaries({key}).get(key)
        if zdict is None:
            run, seq = uuid.UUID(bytes=key[:16]), int.from_bytes(key[16:], "big")
            raise ValueError(f"a packed value refers to snapshot {seq} of run {run}, which is gone")
        text = _unpack(blob, zdict, window)
        if text is None:
            raise zlib.error("a packed value doesn't match the snapshot it refers to")
    return text


class Inflater:
    """inflate() for the values a replay reads in order, many packed against the same
    keyframe: zlib checks a dictionary's checksum each time one is set, which costs as
    much as inflating a delta; here it is set once per dictionary and the primed stream
    copied for each value. Anything else goes to inflate()."""

    def __init__(self) -> None:
        self.zdicts: dict[bytes, bytes] = {}
        self._primed: dict[bytes, Any] = {}

    def keyframe(self, run_id: Any, seq: int, text: bytes) -> None:
        """The text of snapshot `seq` of `run_id`, just read: the values after it may be
        packed against it."""
        self.zdicts[_key(run_id, seq)] = text[-FULL_WINDOW:]
        remember_dictionary(run_id, seq, text)

    def __call__(self, blob: Any) -> bytes:
        if type(blob) is not bytes:
            blob = bytes(blob)
        window = _WINDOWS.get(blob[:1])
        if window is None:  # not packed: a plain zlib stream, or a grouped value
            return _sliced(blob) if blob[:1] in (GROUP, SLICE) else _decompress(blob)
        zdict = self.zdicts.get(blob[1:_LOCATOR])
        # A zlib header with a preset dictionary: 2 bytes and the dictionary's checksum.
        head = blob[_LOCATOR : _LOCATOR + 6]
        if window is None or zdict is None or len(head) < 6 or not head[1] & 0x20:
            return inflate(blob, self.zdicts)
        key = blob[: _LOCATOR + 6]  # mark (window), locator and header
        primed = self._primed.get(key)
        try:
            if primed is None:
                primed = zlib.decompressobj(zdict=zdict[-window:])
                if primed.decompress(head):
                    return inflate(blob, self.zdicts)
                self._primed[key] = primed
            z = primed.copy()
            text = z.decompress(blob[_LOCATOR + 6 :])
        except zlib.error:
            return inflate(blob, self.zdicts)  # not that dictionary: inflate finds it
        if not z.eof:
            raise zlib.error("a packed value is truncated")
        return text


def inflate_many(blobs: list[bytes]) -> list[bytes]:
    """inflate() for many values: the dictionaries of packed ones and the groups of
    regrouped ones in one query per run."""
    blobs = [b if type(b) is bytes else bytes(b) for b in blobs]
    zdicts = dictionaries({b[1:_LOCATOR] for b in blobs if b[:1] in _WINDOWS})
    groups = groups_of(blobs)
    return [inflate(b, zdicts, groups) for b in blobs]


class CompressedJSONField(models.Field):
    """JSON stored as zlib-compressed compact text (bytea on PostgreSQL, BLOB on SQLite).

    Reads back exactly what was written, like JSONText (jsonb would rewrite
    numbers), in a third to a half of the text's bytes: agent states and tool
    results are mostly prose; PostgreSQL's own pglz packs it a third less and only
    tries on rows over 2 KB. The conversion happens in get_db_prep_value and
    from_db_value, so raw SQL can insert `field.get_db_prep_value(value, connection)`.
    A value may also be stored packed against a snapshot's text (`pack`): reading it
    reads that snapshot's data too; `inflate` turns any stored bytes into the text.
    """

    description = "JSON, zlib-compressed"
    empty_strings_allowed = False
    level = 6  # ~45 ms for a 1.2 MB keyframe, rare; a step's few KB take ~0.05 ms

    def get_internal_type(self) -> str:
        return "BinaryField"

    def get_prep_value(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, Prepared):
            return bytes(value)
        return zlib.compress(json_text(value).encode(), self.level)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return value if prepared else self.get_prep_value(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return None if value is None else json.loads(inflate(value))

    def to_python(self, value: Any) -> Any:
        return value

    def value_to_string(self, obj: Any) -> Any:
        return self.value_from_object(obj)  # serializers write it as JSON, as for JSONField

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"form_class": forms.JSONField, **kwargs})


class HashField(models.Field):
    """A SHA-256 digest (or a shorter hex digest): its hex text in Python, its bytes stored
    (bytea on PostgreSQL, BLOB on SQLite), half the size of the text and its index entries.
    Lookups by equality take the hex text; no text lookup (startswith...) applies."""

    description = "a hex digest, stored as bytes"
    empty_strings_allowed = False

    def get_internal_type(self) -> str:
        return "BinaryField"

    def get_prep_value(self, value: Any) -> Any:
        if value is None or isinstance(value, bytes | memoryview):
            return value
        return bytes.fromhex(value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return value if prepared else self.get_prep_value(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or isinstance(value, str):
            return value  # hex text written by code from before migration 0016b (SQLite keeps it)
        return bytes(value).hex()

    def to_python(self, value: Any) -> Any:
        return value

    def value_to_string(self, obj: Any) -> Any:
        return self.value_from_object(obj)

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"form_class": forms.CharField, **kwargs})


class SnapshotKind(models.TextChoices):
    FULL = "full"  # a keyframe: the whole state
    DELTA = "delta"  # ops against the previous snapshot of the run
    REF = "ref"  # same state as the previous snapshot (pre of k == post of k-1)
    # A fork's first snapshot: the state of its run's `forked_from` snapshot (another
    # run's), with `data` ops applied when the state was edited, else no data.
    FORK = "fork"


class Snapshot(models.Model):
    """The agent's whole state at one boundary: before (pre) or after (post) a step.

    Stored as a delta from the previous snapshot of the same run with a full
    keyframe whenever the deltas since the last one outweigh the state itself;
    a fork's first snapshot refers to its source in the parent run.
    Read it with `agentrun.snapshots.load_state(snapshot)`.
    """

    # No index of its own: snapshot_run_seq starts with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="snapshots", db_index=False)
    step = models.IntegerField()
    at = models.CharField(max_length=4, choices=[("pre", "pre"), ("post", "post")])
    # Position in the run: 2*step for pre, 2*step+1 for post.
    seq = models.IntegerField()
    kind = models.CharField(max_length=8, choices=SnapshotKind.choices)
    data = CompressedJSONField(null=True, blank=True)
    keyframe_seq = models.IntegerField()
    hash = HashField()
    size = models.IntegerField(help_text="bytes of the whole state as compact JSON")
    stored_bytes = models.IntegerField(
        default=0, help_text="bytes of data as compact JSON (stored compressed)"
    )
    chain_bytes = models.IntegerField(
        default=0, help_text="delta bytes a read replays (a fork's include its source's)"
    )
    phase = models.CharField(max_length=16, blank=True)
    outcome = models.CharField(max_length=16, blank=True)
    # The paths this snapshot's change touched (agentrun.watch.touched_paths), so watching a
    # value reads only the snapshots that may have changed it; "": not recorded (older rows).
    paths = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            # seq is 2*step (+1 for post), so this also makes (run, step, at) unique.
            models.UniqueConstraint(fields=["run", "seq"], name="snapshot_run_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.at} {self.step} of {self.run_id}"

    @staticmethod
    def seq_for(step: int, at: str) -> int:
        return step * 2 + (1 if at == "post" else 0)

    def state(self) -> dict[str, Any]:
        from agentrun.snapshots import load_state

        return load_state(self)


class ToolCallStatus(models.TextChoices):
    PLANNED = "planned"
    AWAITING_APPROVAL = "awaiting_approval"
    INTENT = "intent"
    OK = "ok"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"
    COMPENSATED = "compensated"
    SKIPPED = "skipped"
    REJECTED = "rejected"
    REPLAYED = "replayed"  # recorded-mode fork: the parent's result, nothing invoked
    CANCELLED = "cancelled"  # its run was cancelled before the call started


# Calls that have not started: cancelling the run ends them as cancelled. A call with an
# intent may be running or may have happened, so it keeps its status (in doubt, compensated…).
PENDING_CALLS = (ToolCallStatus.PLANNED, ToolCallStatus.AWAITING_APPROVAL)


class ToolCall(models.Model):
    # No indexes of their own: toolcall_run_tool_args and toolcall_step_index start with them.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    step = models.ForeignKey(
        Step, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    index = models.IntegerField()
    tool = models.CharField(max_length=100)
    kind = models.CharField(max_length=8)
    args = models.JSONField(default=dict)
    args_hash = HashField()
    idempotency_key = models.CharField(max_length=300)
    status = models.CharField(max_length=20, choices=ToolCallStatus.choices)
    result = CompressedJSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    # [{"at": iso, "error": str|None, "backoff_s": float|None, "duration_ms": float}]
    attempts = models.JSONField(default=list)
    requires_approval = models.BooleanField(default=False)
    approval = models.JSONField(null=True, blank=True)
    compensation = models.JSONField(null=True, blank=True)
    from_cache = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "step__number", "index"]
        constraints = [
            # Also makes idempotency keys unique: a key is {run}:{step}:{index}:... (the
            # engine's idempotency_key), so no index of its own (a fifth of a read call's bytes).
            models.UniqueConstraint(fields=["step", "index"], name="toolcall_step_index"),
        ]
        indexes = [
            # The audit page (side effects, newest first) and the reconciler's hybrid
            # calls to compensate; read calls, the bulk of them, stay out of it.
            models.Index(
                fields=["-created_at"],
                condition=Q(kind__in=("write", "hybrid")),
                name="toolcall_side_effects",
            ),
            # The per-run read cache, and every per-run lookup. Its INCLUDE columns let the
            # search (which steps have a call of this tool, kind or status) and the run page's
            # strip (each step's call kinds) read a 10,000-step run from the index alone
            # (PostgreSQL; elsewhere a plain index): one index, not three, for bytes per step.
            models.Index(
                fields=["run", "tool", "args_hash"],
                include=["kind", "status", "step"],
                name="toolcall_run_tool_args",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.idempotency_key}"


class SearchBlock(models.Model):
    """A part of a finished long run's search index (agentrun.callsearch): the lower-cased
    text of consecutive tool calls, arguments and results, which SQL can look inside
    (a result is stored compressed, often against its step's delta). Derived data: built
    after the run ends, valid while the run's calls are as they were then (`version`),
    deleted with the run and by the purge; never exported."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    version = models.CharField(max_length=200)
    #: The step id of each call in `body`, in order, comma-separated.
    steps = models.TextField()
    #: The calls' text, one call after another (callsearch.CALL_SEP between them).
    body = models.TextField()

    def __str__(self) -> str:
        return f"search block {self.pk} of {self.run_id}"


#: Events that mean a step was tried again: a backoff after an error, or a crash.
RETRY_EVENTS = ("retry_scheduled", "step_crashed")


class Event(models.Model):
    """Append-only log of what the system and the operators did.

    UPDATE and DELETE are refused by a database trigger (see the migration).
    """

    # No indexes of their own: event_run_created starts with run; user is only
    # looked for by the audit page, through event_actions.
    run = models.ForeignKey(
        Run,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="events",
        db_constraint=False,
        db_index=False,
    )
    step = models.IntegerField(null=True, blank=True)
    kind = models.CharField(max_length=40)
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    reason = models.TextField(blank=True)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # The audit page: newest operator actions first. The system's own events
            # (one or more per step) stay out of it.
            models.Index(
                fields=["-created_at"], condition=Q(user__isnull=False), name="event_actions"
            ),
            models.Index(fields=["run", "created_at"], name="event_run_created"),
            # The run list's "succeeded after retries": did a run back off or crash? Holds
            # those events only, not the one or more events of every step.
            models.Index(fields=["run"], condition=Q(kind__in=RETRY_EVENTS), name="event_retries"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not self._state.adding:
            raise PermissionError("events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError("events are append-only")


class ApiToken(models.Model):
    """Bearer tokens for the JSON API; only a hash is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.user}"

    @staticmethod
    def digest_of(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, user: Any) -> str:
        token = "art_" + secrets.token_urlsafe(32)
        cls.objects.create(user=user, digest=cls.digest_of(token), prefix=token[:12])
        return token


# --- tables behind the built-in test tools ---------------------------------


class LedgerEntry(models.Model):
    """One row per idempotency key: what `ledger_write` did."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ledger_entries")
    idempotency_key = models.CharField(max_length=300, unique=True)
    account = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=18, decimal_places=4)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.account} {self.amount}"


class LedgerInvocation(models.Model):
    """Counts every invocation of `ledger_write` per key, duplicates included."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ledger_invocations")
    idempotency_key = models.CharField(max_length=300, unique=True)
    count = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.idempotency_key} x{self.count}"


class OutboxMessage(models.Model):
    """What `notify` sent: not idempotent, one row per invocation."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="outbox")
    idempotency_key = models.CharField(max_length=300)
    to = models.CharField(max_length=200, blank=True)
    body = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"to {self.to}"


class InventoryItem(models.Model):
    sku = models.CharField(max_length=100, unique=True)
    on_hand = models.IntegerField(default=100)
    reserved = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.sku


class Reservation(models.Model):
    """A hold on inventory by `reserve`, released by its compensation."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="reservations")
    idempotency_key = models.CharField(max_length=300, unique=True)
    sku = models.CharField(max_length=100)
    qty = models.IntegerField()
    released = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.qty} x {self.sku}"
