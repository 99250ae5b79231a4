"""Operations on runs that the API, the dashboard and the commands share.

Each one validates first and writes nothing on bad input; operator actions
are recorded as events naming the user.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentrun import engine
from agentrun.agents import InvalidInput, get_agent
from agentrun.audit.events import record_event
from agentrun.engine import compensate_run, enqueue
from agentrun.engine.versions import InvalidVersion, check_version, code_version
from agentrun.infra.queue import ask
from agentrun.lifecycle import labels as run_labels
from agentrun.models import (
    ACTIVE_STATUSES,
    PENDING_CALLS,
    Run,
    RunStatus,
    StepStatus,
    ToolCall,
    ToolCallStatus,
    WaitReason,
)
from agentrun.security import storable
from agentrun.security.redact import redact
from agentrun.store import callsearch, compaction
from agentrun.telemetry import tracing

#: The longest reason or comment an operator may write (cancel, retry, approve, fork, pin,
#: batches), through the API, the forms and the commands alike: it goes into the audit
#: trail, which keeps it forever and shows it on every audit page.
REASON_MAX_LENGTH = 2000


class ActionError(ValueError):
    """The action doesn't apply to the run as it is (e.g. approving a finished run)."""


def _reason_problem(text: Any, name: str = "reason") -> str | None:
    if not isinstance(text, str):
        return f"{name} must be a string"
    if len(text) > REASON_MAX_LENGTH:
        return f"{name} is {len(text)} characters; at most {REASON_MAX_LENGTH}"
    return None


def _check_reason(text: Any, name: str = "reason") -> None:
    problem = _reason_problem(text, name)
    if problem:
        raise ActionError(problem)


def refuse_if_imported(run: Run) -> None:
    """An imported run is a record from elsewhere: nothing here may act on it."""
    if run.imported_at is not None:
        raise ActionError(
            "this run was imported from an archive and is read-only: it can't be cancelled, "
            "approved or retried here (fork it to run it again)"
        )


def start_run(
    agent_name: Any, input: Any, *, user: Any = None, labels: Any = None, trace_parent: str = ""
) -> Run:
    """Validate and create a queued run, then wake a worker for its first step.

    `labels` ({"key": "value"}, see agentrun.lifecycle.labels) are checked first: bad ones raise
    InvalidLabels (an InvalidInput) and nothing is stored. `trace_parent`: the W3C
    traceparent of a traced request that starts it (its trace becomes the run's).
    """
    labels = run_labels.check(labels)
    if not isinstance(agent_name, str) or not agent_name:
        raise InvalidInput("agent must be a non-empty string")
    agent = get_agent(agent_name)
    problem = storable.shape_problem(input, text=True, what="input")
    if problem:
        raise InvalidInput(problem)
    size = len(json.dumps(input, default=str).encode())
    if size > settings.AGENTRUN_MAX_INPUT_BYTES:
        raise InvalidInput(
            f"input is {size} bytes; the limit is {settings.AGENTRUN_MAX_INPUT_BYTES}"
        )
    agent.validate_input(input)
    from agentrun.store import snapshots

    stored = redact(input)
    # The first pre snapshot is written with the run: the worker's claim then finds it
    # in its one statement, instead of building it while holding a connection.
    state = agent.initial_state(stored)
    own_id = agent.run_id(stored)
    with transaction.atomic():
        if own_id is not None and Run.objects.filter(pk=own_id).exists():
            raise InvalidInput(f"a run with id {own_id} exists already")
        run = Run.objects.create(
            **({"id": own_id} if own_id is not None else {}),
            agent=agent.name,
            agent_version=agent.version,
            created_version=code_version(),
            input=stored,
            created_by=user,
            trace_parent=tracing.parse_traceparent(trace_parent),
        )
        run_labels.store(run, labels)
        snap, node = snapshots.build(run.pk, run.next_step, "pre", state, None, None)
        snap.save()
        record_event("run_created", run=run, user=user, payload={"agent": agent.name})
        enqueue(run.pk, run.next_step, version=run.target_version)
    engine.remember_state(run.pk, snap, state, node)
    return run


def cancel_run(run: Run, *, user: Any = None, reason: str = "") -> Run:
    """Cancel an active run: its calls not yet started end as cancelled, its successful
    hybrid calls are compensated."""
    _check_reason(reason)
    refuse_if_imported(run)
    now = timezone.now()
    with transaction.atomic():
        n = Run.objects.filter(pk=run.pk, status__in=ACTIVE_STATUSES).update(
            status=RunStatus.CANCELLED,
            wait_reason="",
            finished_at=now,
            updated_at=now,
            lease_owner="",
            lease_expires_at=None,
            wake_at=None,
        )
        if n != 1:
            raise ActionError(
                f"run is {Run.objects.get(pk=run.pk).status}; only an active run can be cancelled"
            )
        run.steps.filter(
            status__in=(StepStatus.RUNNING, StepStatus.WAITING, StepStatus.RESUMING)
        ).update(status=StepStatus.CANCELLED, finished_at=now)
        run.tool_calls.filter(status__in=PENDING_CALLS).update(
            status=ToolCallStatus.CANCELLED, finished_at=now
        )
        record_event("run_cancelled", run=run, user=user, reason=reason)
    run.refresh_from_db()
    tracing.emit_cancelled(run)  # the trace's root: no worker ends a cancelled run
    compensate_run(run)
    if run.batch_id is not None:  # a replay batch's fork: the batch goes on
        ask("agentrun.batch_advance", run.batch_id, "the batch's next forks")
    if callsearch.indexable(run):
        callsearch.send(run.pk)  # a long run ended: its calls' text, indexed
    if compaction.compactable(run):
        compaction.send(run.pk)  # and its deltas regrouped
    return run


def retry_crashed_step(run: Run, *, user: Any, reason: str = "") -> Run:
    """An operator tries again a step that kept crashing (or whose agent a worker didn't
    know): its crash count starts over, its crash log stays."""
    _check_reason(reason)
    refuse_if_imported(run)
    now = timezone.now()
    with transaction.atomic():
        n = Run.objects.filter(
            pk=run.pk, status=RunStatus.WAITING, wait_reason=WaitReason.CRASHED
        ).update(status=RunStatus.RUNNING, wait_reason="", error="", updated_at=now)
        if n != 1:
            raise ActionError("only a run waiting after its step crashed can be retried")
        run.refresh_from_db()
        # Not "running": the next claim is an attempt, not a crash noticed.
        run.steps.filter(number=run.next_step).update(crashes=0, status=StepStatus.WAITING)
        record_event("step_retried", run=run, step=run.next_step, user=user, reason=reason)
        enqueue(run.pk, run.next_step, version=run.target_version)
    return run


def decide_approval(
    run: Run, *, user: Any, decision: str, comment: str = "", resolution: str | None = None
) -> Run:
    """An operator approves or rejects the call the run is waiting on.

    For a call left in doubt, `resolution` says what "approve" means: "retry"
    (invoke it again; the default) or "mark_done" (it did happen; go on).
    """
    if decision not in ("approve", "reject"):
        raise ActionError('decision must be "approve" or "reject"')
    _check_reason(comment, "comment")
    if resolution not in (None, "retry", "mark_done"):
        raise ActionError('resolution must be "retry" or "mark_done"')
    run.refresh_from_db()
    refuse_if_imported(run)
    if run.status != RunStatus.WAITING or run.wait_reason not in (
        WaitReason.APPROVAL,
        WaitReason.IN_DOUBT,
    ):
        raise ActionError(
            f"run is {run.status}{' (' + run.wait_reason + ')' if run.wait_reason else ''}; "
            "it is not waiting for an operator"
        )
    waiting_status = (
        ToolCallStatus.AWAITING_APPROVAL
        if run.wait_reason == WaitReason.APPROVAL
        else ToolCallStatus.IN_DOUBT
    )
    tc = (
        ToolCall.objects.filter(run=run, status=waiting_status)
        .order_by("-step__number", "index")
        .first()
    )
    if tc is None:
        raise ActionError("no tool call is waiting for a decision")
    record = {
        "decision": decision,
        "by": user.get_username(),
        "at": timezone.now().isoformat(),
        "comment": comment,
    }
    if run.wait_reason == WaitReason.IN_DOUBT:
        record["resolution"] = resolution or "retry"
    with transaction.atomic():
        n = Run.objects.filter(
            pk=run.pk, status=RunStatus.WAITING, wait_reason=run.wait_reason
        ).update(status=RunStatus.QUEUED, wait_reason="", updated_at=timezone.now())
        if n != 1:
            raise ActionError("the run changed meanwhile; reload and try again")
        if decision == "reject" and run.wait_reason == WaitReason.IN_DOUBT:
            record["resolution"] = "reject"
        tc.approval = record
        tc.status = (
            ToolCallStatus.PLANNED
            if run.wait_reason == WaitReason.APPROVAL
            else ToolCallStatus.IN_DOUBT
        )
        if run.wait_reason == WaitReason.IN_DOUBT and decision == "reject":
            tc.requires_approval = True  # the engine fails the run on a rejected call
        tc.save(update_fields=["approval", "status", "requires_approval"])
        # The next claim resumes the attempt that waited for this decision: no crash
        # noticed (not "running"), no attempt more (an approval is not a retry).
        run.steps.filter(number=run.next_step).update(status=StepStatus.RESUMING)
        record_event(
            "approved" if decision == "approve" else "rejected",
            run=run,
            step=run.next_step,
            user=user,
            reason=comment,
            payload={
                "tool": tc.tool,
                "key": tc.idempotency_key,
                "resolution": record.get("resolution"),
            },
        )
        enqueue(run.pk, run.next_step, version=run.target_version)
    run.refresh_from_db()
    return run


class ForkError(ValueError):
    """A fork request that can't be honoured; `field` names the bad input."""

    def __init__(self, message: str, field: str = "", path: str | None = None):
        super().__init__(message)
        self.field = field
        self.path = path  # where in an edited state, when the schema says


FORK_MODES = ("sandbox", "recorded", "live")


def check_fork_state(agent: Any, state: Any) -> None:
    """Raise ForkError unless `state` may be a fork's edited state of `agent`'s runs:
    storable, not too large, and valid for the agent's schema (what fork_run checks)."""
    problem = storable.shape_problem(
        state, depth=storable.max_depth(state=True), text=True, what="state"
    )
    if problem:
        raise ForkError(problem, "state")
    size = len(json.dumps(state, default=str).encode())
    if size > settings.AGENTRUN_MAX_INPUT_BYTES * 8:
        raise ForkError(f"state is {size} bytes; too large", "state")
    try:
        agent.validate_state(state)
    except ValueError as exc:
        raise ForkError(f"state: {exc}", "state", getattr(exc, "path", None)) from None


def check_fork_phase(state: Any) -> None:
    """Raise ForkError if a fork from `state` would have nothing to run."""
    phase = state.get("phase") if isinstance(state, dict) else None
    if phase in ("done", "error"):
        raise ForkError(
            f"the state's phase is {phase!r}: nothing would run. Fork from an earlier "
            "snapshot (e.g. the pre snapshot of that step) or edit the phase",
            "state",
            "phase",
        )


def side_effects_after(run: Run, step: int, at: str) -> list[ToolCall]:
    """The parent's write/hybrid calls a live fork from (step, at) would run again."""
    first = step if at == "pre" else step + 1
    return list(
        ToolCall.objects.filter(run=run, kind__in=("write", "hybrid"), step__number__gte=first)
        .select_related("step")
        .order_by("step__number", "index")
    )


def fork_run(
    run: Run,
    *,
    step: Any,
    at: Any = "pre",
    state: Any = None,
    mode: Any = "sandbox",
    reason: Any = "",
    user: Any = None,
    confirm_live: bool = False,
    labels: Any = None,
    version: Any = None,
    batch: Any = None,
) -> Run:
    """Start a new run from the (step, at) snapshot of `run`, optionally with an edited state.

    The fork links to its parent and source snapshot, numbers its steps on from
    the fork point, and never changes the parent. Raises ForkError (nothing
    stored) on a bad request. The fork has its parent's labels, `labels` (checked
    like a new run's) and forked-from=<the parent's short id>. With a `version`, only
    workers of that code version execute it.
    """
    from agentrun.models import Snapshot
    from agentrun.store import delta, snapshots

    if isinstance(step, bool) or not isinstance(step, int):
        raise ForkError("step must be an integer", "step")
    if at not in ("pre", "post"):
        raise ForkError('at must be "pre" or "post"', "at")
    if not 0 <= step < 2**30:  # snapshot positions (2 * step) are 32-bit
        raise ForkError(f"run has no {at} snapshot of step {step}", "step")
    if mode not in FORK_MODES:
        raise ForkError(f"mode must be one of {', '.join(FORK_MODES)}", "mode")
    problem = _reason_problem(reason)
    if problem:
        raise ForkError(problem, "reason")
    if version is not None:
        try:
            check_version(version)
        except InvalidVersion as exc:
            raise ForkError(str(exc), "version") from None
    if run.purged_at is not None:
        raise ForkError(_purged(run))
    try:
        fork_labels = run_labels.for_fork(
            {**run_labels.of(run), **run_labels.check(labels)}, run.pk
        )
    except run_labels.InvalidLabels as exc:
        raise ForkError(str(exc), "labels") from None
    if len(fork_labels) > run_labels.MAX_LABELS + 1:  # its own, and forked-from
        raise ForkError(
            f"the fork would have {len(fork_labels) - 1} labels besides "
            f"{run_labels.FORKED_FROM}; a run has at most {run_labels.MAX_LABELS}",
            "labels",
        )
    source = Snapshot.objects.filter(run=run, seq=Snapshot.seq_for(step, at)).first()
    if source is None:
        last = run.steps.order_by("-number").values_list("number", flat=True).first()
        known = f"steps {run.first_step}..{last}" if last else "no steps yet"
        raise ForkError(f"run has no {at} snapshot of step {step} ({known})", "step")
    agent = get_agent(run.agent)
    source_state = snapshots.load_state(source)
    new_state = source_state if state is None else state
    if state is not None:
        check_fork_state(agent, state)
    check_fork_phase(new_state)
    try:
        # An agent whose runs are found by an id of their own (a LangGraph thread's)
        # says what its fork's input is, and the labels that differ from its parent's.
        fork_input, own_labels = agent.fork_input(run, step, at, new_state)
    except ValueError as exc:
        raise ForkError(str(exc)) from None
    fork_labels.update(own_labels)
    own_id = agent.run_id(fork_input) if fork_input is not run.input else None
    phase = new_state.get("phase") if isinstance(new_state, dict) else None
    if mode == "live" and not confirm_live and side_effects_after(run, step, at):
        raise ForkError("a live fork runs write/hybrid tools for real: confirm it", "confirm_live")
    first = step if at == "pre" else step + 1
    edits = delta.diff(source_state, new_state) if state is not None else []
    with transaction.atomic():
        # Retention takes a run with a conditional UPDATE of its row: with the row locked
        # here, either the purge sees this fork (and keeps the run) or this sees the purge.
        locked = Run.objects.select_for_update(no_key=True).filter(pk=run.pk)
        if locked.values_list("purged_at", flat=True).first() is not None:
            raise ForkError(_purged(run))
        if own_id is not None and Run.objects.filter(pk=own_id).exists():
            raise ForkError(f"a run with id {own_id} exists already")
        fork = Run.objects.create(
            **({"id": own_id} if own_id is not None else {}),
            agent=run.agent,
            agent_version=agent.version,
            input=fork_input,
            parent=run,
            forked_from=source,
            mode=mode,
            created_by=user,
            created_version=code_version(),
            target_version=version or "",
            batch=batch,
            first_step=first,
            next_step=first,
            phase=str(phase or ""),
        )
        run_labels.store(fork, fork_labels)
        # A reference to the source (plus the edits), not a copy of the whole state.
        snap, node = snapshots.fork(fork.pk, first, source, source_state, new_state, edits)
        snap.save()
        record_event(
            "run_forked",
            run=fork,
            step=first,
            user=user,
            reason=reason,
            payload={
                "parent": str(run.pk),
                "step": step,
                "at": at,
                "mode": mode,
                "source_hash": source.hash,
                "edited": state is not None,
                "edits": edits,
                **({"version": version} if version else {}),
                **({"batch": str(batch.pk)} if batch is not None else {}),
            },
        )
        enqueue(fork.pk, first, version=fork.target_version)
    # An in-process executor (and a worker sharing this process) starts warm.
    engine.remember_state(fork.pk, snap, new_state, node)
    return fork


# --- pins ----------------------------------------------------------------


def _purged(run: Run) -> str:
    return "the run was purged by retention: its snapshots are gone (its audit trail stays)"


#: What a pin's reason may not be only made of (the API's pattern says the same).
BLANK = " \t\n\r\f\v"
PIN_REASON_MAX = REASON_MAX_LENGTH


class PinError(ValueError):
    """A pin request with bad input (no reason, too long): nothing changed."""


def _pin_reason(reason: Any) -> str:
    if not isinstance(reason, str) or not reason.strip(BLANK):
        raise PinError("a pin needs a reason, e.g. the incident it is kept for")
    if len(reason) > PIN_REASON_MAX:
        raise PinError(f"the reason is {len(reason)} characters; at most {PIN_REASON_MAX}")
    problem = storable.shape_problem(reason, text=True, what="reason")
    if problem:
        raise PinError(problem)
    return reason.strip(BLANK)


def pin_run(run: Run, *, user: Any, reason: Any) -> Run:
    """Keep a run from retention, with its fork ancestors and descendants ("incident #123").

    Pinning a pinned run changes its reason. Refused (ActionError) once the run is purged.
    """
    reason = _pin_reason(reason)
    now = timezone.now()
    with transaction.atomic():
        # Conditional: a purge that took the run first wins, and this one says so.
        pinned = Run.objects.filter(pk=run.pk, purged_at__isnull=True).update(
            pinned_at=run.pinned_at or now, pinned_by=user, pin_reason=reason, updated_at=now
        )
        if not pinned:
            raise ActionError("the run was purged by retention: there is nothing left to keep")
        record_event(
            "run_pinned",
            run=run,
            user=user,
            reason=reason,
            payload={"repinned": run.pinned_at is not None},
        )
    run.refresh_from_db()
    return run


def unpin_run(run: Run, *, user: Any, reason: Any = "") -> Run:
    """Let retention purge the run again when its time comes (ActionError if not pinned)."""
    if not isinstance(reason, str) or len(reason) > PIN_REASON_MAX:
        raise PinError(f"the reason must be text of at most {PIN_REASON_MAX} characters")
    problem = storable.shape_problem(reason, text=True, what="reason")
    if problem:
        raise PinError(problem)
    now = timezone.now()
    with transaction.atomic():
        unpinned = Run.objects.filter(pk=run.pk, pinned_at__isnull=False).update(
            pinned_at=None, pinned_by=None, pin_reason="", updated_at=now
        )
        if not unpinned:
            raise ActionError("the run is not pinned")
        record_event(
            "run_unpinned",
            run=run,
            user=user,
            reason=reason.strip(BLANK),
            payload={"was": run.pin_reason},
        )
    run.refresh_from_db()
    return run
