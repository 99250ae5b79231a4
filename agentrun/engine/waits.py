"""Parking a run: a backoff until a due time, or a wait for an operator."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from agentrun.engine.context import Claimed, Outcome, flush_pending, save_call
from agentrun.engine.lease import guarded_update
from agentrun.engine.queue import enqueue
from agentrun.events import record_event
from agentrun.models import (
    RunStatus,
    Step,
    StepStatus,
    ToolCall,
    WaitReason,
)


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
        enqueue(ctx.run.pk, ctx.step.number, countdown=seconds)
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
