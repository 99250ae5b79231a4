"""The truth about every run lives in these tables.

Status changes that race (claim, commit, cancel) are conditional UPDATEs:
`Run.objects.filter(pk=..., next_step=n, lease_owner=me).update(...) == 1`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import uuid
import zlib
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agentrun.store.codec import LEVEL, Prepared, inflate, json_text


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
    # Input tokens the provider served from its prompt cache (part of tokens_in), and what
    # the run's model calls cost at AGENTRUN_LLM_PRICES when they were made (US dollars).
    tokens_cached = models.IntegerField(default=0, db_default=0)
    cost_usd = models.FloatField(default=0.0, db_default=0.0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Retention (agentrun.lifecycle.retention): a pinned run, its fork ancestors and descendants
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
    # Imported from an archive (agentrun.lifecycle.archive): read-only here, never resumed or
    # reconciled; `imported` says from where (source, exporter, archive digest, lineage).
    imported_at = models.DateTimeField(null=True, blank=True)
    imported = models.JSONField(null=True, blank=True)
    # Code versions (agentrun.engine.versions): the version of the process that created
    # the run, the version it asks for (only workers of that version execute it; blank:
    # any worker), and the version of the worker that claimed its latest step.
    created_version = models.CharField(max_length=64, blank=True)
    target_version = models.CharField(max_length=64, blank=True)
    code_version = models.CharField(max_length=64, blank=True)
    # The W3C traceparent of the traced request that started the run (agentrun.telemetry.tracing):
    # its trace is the run's. Blank: the run's trace id is its own id.
    trace_parent = models.CharField(max_length=55, blank=True, default="", db_default="")
    # A fork made by a replay batch: the batch hears when it ends.
    batch = models.ForeignKey(
        "ReplayBatch",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # run_batch: the few runs that are in one
    )

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
            # A batch's forks (the runs of a replay batch), for its progress.
            models.Index(fields=["batch"], condition=Q(batch__isnull=False), name="run_batch"),
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
    """One `key=value` label of a run (agentrun.lifecycle.labels holds the rules). Set at the start."""

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
            # ?label=value (a bare word may be a value, of any key).
            models.Index(fields=["value"], name="runlabel_value"),
        ]

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


class StepStatus(models.TextChoices):
    RUNNING = "running"
    WAITING = "waiting"
    # An operator decided what the step waited on (an approval, a call in doubt): its next
    # claim resumes the attempt that waited, it is not another attempt.
    RESUMING = "resuming"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


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
    level = LEVEL

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
    # The lease owner of the current (or last) attempt, and the code version it ran.
    worker = models.CharField(max_length=100, blank=True)
    code_version = models.CharField(max_length=64, blank=True)
    phase_before = models.CharField(max_length=16, blank=True)
    phase_after = models.CharField(max_length=16, blank=True)
    # thought, rationale, calls | final; for LLM agents also the raw request/response.
    decision = models.JSONField(null=True, blank=True)
    # A framework's own checkpoint of the step, in its own format (agentrun.store.checkpoints):
    # read back by its checkpointer (LangGraph's), never shown. Null for agentrun's agents.
    checkpoint = CompressedJSONField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_count = models.IntegerField(default=0)
    failure = models.JSONField(null=True, blank=True)
    tokens_in = models.IntegerField(default=0)
    tokens_out = models.IntegerField(default=0)
    tokens_cached = models.IntegerField(default=0, db_default=0)
    # Null: no price for the step's model (or no model call).
    cost_usd = models.FloatField(null=True, blank=True)
    llm_latency_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    state_size = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # While the committed attempt's spans are not known to be exported
    # (agentrun.telemetry.tracing): when the reconciler emits them again, from these rows,
    # unless the export is on record first (it clears this). A worker killed between its
    # commit and its export loses no span. Null: exported, or traces off at the commit.
    trace_due_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="step_run_number")]
        indexes = [
            # The run list's "succeeded after retries": does a run have a step that crashed?
            # Holds the few crashed steps only; a step's usual updates leave it alone.
            models.Index(fields=["run"], condition=Q(crashes__gt=0), name="step_crashed"),
            # Committed steps whose spans are not exported yet: a few seconds' worth while
            # traces are on, none while they are off.
            models.Index(
                fields=["trace_due_at"],
                condition=Q(trace_due_at__isnull=False),
                name="step_trace_due",
            ),
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
    Read it with `agentrun.store.snapshots.load_state(snapshot)`.
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
    # The paths this snapshot's change touched (agentrun.store.paths.touched_paths), so watching a
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
    """A part of a finished long run's search index (agentrun.store.callsearch): the lower-cased
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
#: Events that mean a step waited: a backoff, a crash, an approval, a call in doubt.
WAIT_EVENTS = ("retry_scheduled", "step_crashed", "approval_requested", "tool_call_in_doubt")


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
    # The hash chain (agentrun.audit.chain), set by the database as the row is inserted:
    # whatever the inserting code puts here is overwritten.
    stream = models.CharField(max_length=60, default="", db_default="", editable=False)
    seq = models.BigIntegerField(default=0, db_default=0, editable=False)
    prev_hash = models.CharField(max_length=64, default="", db_default="", editable=False)
    hash = models.CharField(max_length=64, default="", db_default="", editable=False)
    # The database role of the connection that inserted it (PostgreSQL's session_user).
    db_role = models.CharField(max_length=63, default="", db_default="", editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # One event per position in its stream: a chain can't fork. Every chained
            # event has a position from 1; the condition makes it an index (not a table
            # constraint, which SQLite would rebuild the table for, dropping its triggers).
            models.UniqueConstraint(
                fields=["stream", "seq"], condition=Q(seq__gt=0), name="event_stream_seq"
            ),
        ]
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


class AuditHead(models.Model):
    """The last link of one audit stream: its position and hash.

    Written only by the database trigger that chains each event (the app's role may read
    it); appending to a stream locks its row, so concurrent appends queue up instead of
    forking the chain."""

    stream = models.CharField(max_length=60, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"{self.stream} @ {self.seq}"


class Worker(models.Model):
    """A worker process that is (or was lately) alive, and the code version it runs.

    Each worker keeps its row fresh (agentrun.engine.versions.Heartbeat); a run that asks
    for a version no live worker runs says so instead of waiting silently."""

    name = models.CharField(max_length=200, primary_key=True)
    version = models.CharField(max_length=64)
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} ({self.version})"


class BatchStatus(models.TextChoices):
    RUNNING = "running"  # forks are being made and run
    DONE = "done"  # every run was forked (or skipped) and every fork ended
    CANCELLED = "cancelled"  # no new forks; those made run to their end


class ReplayBatch(models.Model):
    """Runs hit by one incident, replayed together: each forked from its own fork point.

    `selection` is the run list's filter that chose them, `start_from` where each is
    forked ("before-failure", "start", {"tool": T} or {"step": N}); its items are fixed
    when it is made, its forks made as room frees up (at most `max_in_flight` at once).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    selection = models.JSONField(default=dict)
    start_from = models.JSONField(default=str)
    mode = models.CharField(max_length=16, choices=ReplayMode.choices)
    version = models.CharField(max_length=64, blank=True)
    max_in_flight = models.IntegerField()
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.RUNNING
    )
    promoted_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="promotions"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"batch {self.name} ({self.id})"

    @property
    def is_active(self) -> bool:
        return self.status == BatchStatus.RUNNING


class ItemStatus(models.TextChoices):
    PENDING = "pending"  # its fork is not made yet
    FORKED = "forked"
    SKIPPED = "skipped"  # no fork point in this run, or the fork was refused: see skip_reason


class Verdict(models.TextChoices):
    FIXED = "fixed"  # the parent failed, the fork succeeded
    STILL_FAILING = "still_failing"  # both failed with the same error
    FAILING_DIFFERENTLY = "failing_differently"  # the fork failed, not as the parent did
    CHANGED_SIDE_EFFECTS = "changed_side_effects"  # same outcome, other writes
    UNCHANGED = "unchanged"  # same outcome, same writes
    CANCELLED = "cancelled"  # the fork was cancelled before it ended


class BatchItem(models.Model):
    """One run of a batch: where it is forked from, its fork, and the fork's verdict."""

    batch = models.ForeignKey(ReplayBatch, on_delete=models.CASCADE, related_name="items")
    position = models.IntegerField()
    parent = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="+")
    step = models.IntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=ItemStatus.choices, default=ItemStatus.PENDING)
    skip_reason = models.TextField(blank=True)
    fork = models.OneToOneField(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="batch_item"
    )
    verdict = models.CharField(max_length=24, choices=Verdict.choices, blank=True)

    class Meta:
        ordering = ["batch", "position"]
        constraints = [
            # A run is in a batch once; also the way from a batch to its items, in order.
            models.UniqueConstraint(fields=["batch", "position"], name="batchitem_position"),
            models.UniqueConstraint(fields=["batch", "parent"], name="batchitem_parent"),
        ]

    def __str__(self) -> str:
        return f"item {self.position} of {self.batch_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # not delivered yet: its next attempt is due at next_attempt_at
    DELIVERED = "delivered"
    GAVE_UP = "gave_up"  # AGENTRUN_WEBHOOK_MAX_ATTEMPTS attempts failed


class WebhookDelivery(models.Model):
    """One notification to the failure webhook (agentrun.telemetry.webhooks): a run failed,
    or a step kept crashing. Made once per (run, event, step), delivered at most once: an
    attempt first claims the row, a receiver can tell retries apart by the delivery id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_index=False)
    event = models.CharField(max_length=40)
    step = models.IntegerField()
    payload = models.JSONField(default=dict)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # An attempt in progress holds the row until then (a second sender skips it).
    claimed_until = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            # One notification per event; also the way from a run to its deliveries.
            models.UniqueConstraint(fields=["run", "event", "step"], name="webhook_once"),
        ]
        indexes = [
            # The reconciler's deliveries still to make, oldest due first.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="webhook_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.run_id} ({self.status})"


class SavedView(models.Model):
    """A named filter of the run list, an operator's own. Its filter is the run list's
    query (agentrun.lifecycle.selection's fields), so its link is the run list's URL with
    that query: one anyone with a role can open."""

    # No index of its own: savedview_owner_name starts with owner.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    name = models.CharField(max_length=100)
    query = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    #: The most views an operator keeps.
    MAX_PER_OWNER = 50

    class Meta:
        ordering = ["owner", "name"]
        constraints = [
            # A name once per operator (saving it again replaces its filter); also the way
            # from an operator to their views, in name order.
            models.UniqueConstraint(fields=["owner", "name"], name="savedview_owner_name"),
        ]

    def __str__(self) -> str:
        return self.name


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
