"""Parking a run: a backoff until a due time, or a wait for an operator."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agentrun.audit.events import record_event
from agentrun.engine.commit import failure_context
from agentrun.engine.context import Claimed, Outcome, flush_pending, save_call
from agentrun.engine.lease import guarded_update
from agentrun.infra.queue import enqueue
from agentrun.models import (
    Run,
    RunStatus,
    Step,
    StepStatus,
    ToolCall,
    WaitReason,
)

log = logging.getLogger(__name__)


def back_off(
    ctx: Claimed,
    tc: ToolCall | None,
    seconds: float,
    message: str,
    *,
    retry_after: float | None = None,
) -> Outcome:
    """Park the run until `seconds` from now; the step is retried then (same decision)."""
    wake = timezone.now() + timedelta(seconds=seconds)
    with transaction.atomic():
        guarded_update(
            ctx,
            status=RunStatus.WAITING,
            wait_reason=WaitReason.BACKOFF,
            wake_at=wake,
            lease_owner="",
            lease_expires_at=None,
        )
        # The attempt ended with an outcome: its next claim is not a crash.
        Step.objects.filter(pk=ctx.step.pk).update(status=StepStatus.WAITING)
        flush_pending(ctx)
        if tc is not None:
            save_call(tc, ["status", "error", "attempts"])
            payload = {"tool": tc.tool, "key": tc.idempotency_key, "attempt": len(tc.attempts)}
        else:
            payload = {"attempt": ctx.step.attempts}
        if retry_after is not None:
            payload["retry_after_s"] = retry_after
        record_event(
            "retry_scheduled",
            run=ctx.run,
            step=ctx.step.number,
            payload={**payload, "backoff_s": seconds, "error": message},
        )
        # A hint only: the wake-up time is in the database and the reconciler honours it.
        enqueue(ctx.run.pk, ctx.step.number, countdown=seconds, version=ctx.run.target_version)
    return Outcome("backoff", str(ctx.run.pk), ctx.step.number, message)


def park(ctx: Claimed, tc: ToolCall, reason: str, tc_status: str, event: str) -> Outcome:
    with transaction.atomic():
        guarded_update(
            ctx, status=RunStatus.WAITING, wait_reason=reason, lease_owner="", lease_expires_at=None
        )
        flush_pending(ctx)
        tc.status = tc_status
        save_call(tc, ["status", "error", "attempts"])
        Step.objects.filter(pk=ctx.step.pk).update(status=StepStatus.WAITING)
        record_event(
            event,
            run=ctx.run,
            step=ctx.step.number,
            payload={"tool": tc.tool, "key": tc.idempotency_key, "args": tc.args},
        )
    return Outcome("waiting", str(ctx.run.pk), ctx.step.number, reason)


def crash_delay(crashes: int) -> float:
    """Seconds before a step that crashed `crashes` times is tried again."""
    return float(min(2 ** max(crashes - 1, 0), 60))


def note_crash(ctx: Claimed, exc: BaseException) -> None:
    """An exception escaped the step (outside a tool): count it, keep its context, and
    hand the run back with a short backoff instead of waiting for the lease to expire.

    Best effort: when this fails too (the database is what broke), the next claim
    counts the attempt as a crash all the same.
    """
    crashes = ctx.step.crashes + 1
    entry = {
        **failure_context(ctx, exc, where="crash"),
        "worker": ctx.owner,
        "at": timezone.now().isoformat(),
    }
    delay = crash_delay(crashes)
    for last_try in (False, True):
        try:
            _record_crash(ctx, crashes, entry, delay)
            return
        except Exception:  # noqa: BLE001 -- the claim will count it
            if last_try:
                log.exception(
                    "could not record the crash of step %s of %s", ctx.step.number, ctx.run.pk
                )
            # A connection the database dropped (a restart) goes back to the pool, which
            # discards it; the second try gets a live one.
            connection.close()


def _record_crash(ctx: Claimed, crashes: int, entry: dict[str, Any], delay: float) -> None:
    with transaction.atomic():
        guarded_update(
            ctx,
            status=RunStatus.WAITING,
            wait_reason=WaitReason.BACKOFF,
            wake_at=timezone.now() + timedelta(seconds=delay),
            lease_owner="",
            lease_expires_at=None,
        )
        Step.objects.filter(pk=ctx.step.pk).update(
            status=StepStatus.WAITING,
            crashes=crashes,
            crash_log=[*ctx.step.crash_log, entry],
        )
        record_event(
            "step_crashed",
            run=ctx.run,
            step=ctx.step.number,
            payload={
                "crashes": crashes,
                "error": entry["message"][:2000],
                "type": entry["type"],
                "retry_in_s": delay,
            },
        )
        enqueue(ctx.run.pk, ctx.step.number, countdown=delay, version=ctx.run.target_version)


def park_crashed(ctx: Claimed) -> Outcome:
    """A step that crashed AGENTRUN_MAX_STEP_ATTEMPTS times is not tried again: the run
    waits for an operator, with every crash on record on the step."""
    crashes = ctx.step.crashes
    last = (ctx.step.crash_log or [{}])[-1]
    message = (
        f"step {ctx.step.number} crashed {crashes} times (AGENTRUN_MAX_STEP_ATTEMPTS); last:"
        f" {last.get('type') or 'lost'}: {last.get('message') or last.get('error', '')}"
    )[:2000]
    failure = {
        "step": ctx.step.number,
        "where": "crashes",
        "type": "PoisonStep",
        "message": message,
        "tool": None,
        "traceback": last.get("traceback", ""),
        "input": None,
        "crashes": ctx.step.crash_log,
    }
    with transaction.atomic():
        guarded_update(
            ctx,
            status=RunStatus.WAITING,
            wait_reason=WaitReason.CRASHED,
            lease_owner="",
            lease_expires_at=None,
            error=message,
        )
        Step.objects.filter(pk=ctx.step.pk).update(status=StepStatus.WAITING, failure=failure)
        record_event(
            "step_poisoned",
            run=ctx.run,
            step=ctx.step.number,
            payload={"crashes": crashes, "error": message},
        )
    log.error("run %s: %s", ctx.run.pk, message)
    return Outcome("waiting", str(ctx.run.pk), ctx.step.number, message)


def park_unknown_agent(run: Run, number: int, owner: str, message: str) -> Outcome:
    """This worker doesn't know the run's agent (its module isn't loaded here): say so on
    the run, which waits for an operator to retry it once the workers are fixed."""
    worker = owner.rsplit(":", 1)[0]
    message = (
        f"{message} in worker {worker}: is its module in this worker's AGENTRUN_AGENT_MODULES?"
    )[:2000]
    with transaction.atomic():
        parked = Run.objects.filter(
            pk=run.pk, next_step=number, lease_owner=owner, status=RunStatus.RUNNING
        ).update(
            status=RunStatus.WAITING,
            wait_reason=WaitReason.CRASHED,
            lease_owner="",
            lease_expires_at=None,
            error=message,
            updated_at=timezone.now(),
        )
        if parked:
            record_event("unknown_agent", run=run, step=number, payload={"error": message})
    log.error("run %s: %s", run.pk, message)
    return Outcome("waiting", str(run.pk), number, message)
