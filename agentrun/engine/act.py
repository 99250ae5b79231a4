"""Phase 3: the tool calls, each with its intent, attempts and result on record."""

from __future__ import annotations

import logging
import os
import time

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentrun.agents import Call, CallResult
from agentrun.engine.commit import fail_step, failure_context
from agentrun.engine.compensate import compensate_run
from agentrun.engine.context import (
    DONE,
    SIDE_EFFECTS,
    Claimed,
    LeaseLost,
    Outcome,
    flush_pending,
    result_of,
    save_call,
)
from agentrun.engine.decide import read_cache_query
from agentrun.engine.invoke import Abandoned, call_with_timeout
from agentrun.engine.lease import guarded_update
from agentrun.engine.replay import (
    is_sandboxed,
    replay_call,
    replayed_result,
    replaying,
    skip_in_sandbox,
)
from agentrun.engine.waits import back_off, park
from agentrun.models import (
    Run,
    RunStatus,
    ToolCall,
    ToolCallStatus,
    WaitReason,
)
from agentrun.security import storable
from agentrun.security.storable import escape_text
from agentrun.store import rawsql
from agentrun.tools import Tool, ToolContext, get_tool

log = logging.getLogger(__name__)


class ResultRefused(Exception):
    """A tool's result that can't be stored (too deep or too large): the call failed for
    good, and its message says that it ran."""


def act_on_call(ctx: Claimed, call: Call, tc: ToolCall) -> CallResult | Outcome:
    t = get_tool(call.tool)
    if tc.status in DONE:
        return result_of(tc, call)
    if tc.status == ToolCallStatus.REPLAYED:
        return replayed_result(ctx, call, tc)
    if replaying(ctx):
        return replay_call(ctx, call, tc)
    if is_sandboxed(ctx) and t.kind in SIDE_EFFECTS:
        return skip_in_sandbox(ctx, call, tc)
    if tc.requires_approval:
        approval = tc.approval or {}
        if not approval:
            return park(
                ctx, tc, WaitReason.APPROVAL, ToolCallStatus.AWAITING_APPROVAL, "approval_requested"
            )
        if approval.get("decision") == "reject":
            with transaction.atomic():
                guarded_update(ctx)
                tc.status = ToolCallStatus.REJECTED
                save_call(tc, ["status"])
            return fail_step(
                ctx,
                {
                    "step": ctx.step.number,
                    "type": "Rejected",
                    "message": f"{tc.tool} rejected by {approval.get('by')}: {approval.get('comment', '')}",
                    "tool": tc.tool,
                    "traceback": "",
                    "input": tc.args,
                },
            )
    if t.kind == "read" and t.cache:
        cached = _read_cache(ctx, call, tc)
        if cached is not None:
            return cached
    if t.kind in SIDE_EFFECTS and tc.status in (ToolCallStatus.INTENT, ToolCallStatus.IN_DOUBT):
        resolution = (tc.approval or {}).get("resolution")
        if resolution == "mark_done":
            with transaction.atomic():
                guarded_update(ctx)
                tc.status, tc.finished_at = ToolCallStatus.OK, timezone.now()
                tc.save(update_fields=["status", "finished_at"])
            return result_of(tc, call)
        if not t.idempotent and resolution != "retry" and _was_invoked(tc):
            return park(ctx, tc, WaitReason.IN_DOUBT, ToolCallStatus.IN_DOUBT, "tool_call_in_doubt")
    if t.kind in SIDE_EFFECTS and tc.status != ToolCallStatus.INTENT:
        if (tc.approval or {}).get("resolution") == "retry":
            # The operator's "retry" is for this one attempt: a new doubt asks again.
            tc.approval = {**tc.approval, "resolution": "retried"}
        with transaction.atomic():
            guarded_update(ctx)
            flush_pending(ctx)
            tc.status = ToolCallStatus.INTENT
            tc.save(update_fields=["status", "approval"])
    return _invoke(ctx, call, tc, t)


def _was_invoked(tc: ToolCall) -> bool:
    """Intent recorded and an attempt started that never recorded its end."""
    return any(
        a.get("started") and not a.get("ended") and a.get("fault") != "crash_before"
        for a in tc.attempts
    )


def _read_cache(ctx: Claimed, call: Call, tc: ToolCall) -> CallResult | None:
    """The result of the same read call made earlier in this run, if any."""
    if tc.index in ctx.read_hits:  # looked up with the decision
        raw = ctx.read_hits.pop(tc.index)
    else:
        with connection.cursor() as cursor:
            cursor.execute(*read_cache_query(ctx, tc))
            row = cursor.fetchone()
        raw = None if row is None else row[0]
    if raw is None:
        return None
    tc.status, tc.result, tc.from_cache, tc.finished_at = (
        ToolCallStatus.OK,
        rawsql.convert(ToolCall, "result", raw),
        True,
        timezone.now(),
    )
    ctx.pending.append(tc)
    return result_of(tc, call)


def _attempt_start(ctx: Claimed, tc: ToolCall, call: Call) -> None:
    """Record that an attempt starts; arms a scripted fault on the first attempt."""
    first = not tc.attempts
    tc.attempts = [*tc.attempts, {"at": timezone.now().isoformat(), "started": True}]
    fault = call.fault if (first and settings.AGENTRUN_FAULTS) else None
    if fault:
        tc.attempts[-1]["fault"] = fault
    if tc.kind in SIDE_EFFECTS or fault:
        with transaction.atomic():
            guarded_update(ctx)
            flush_pending(ctx)
            save_call(tc, ["attempts", "status"])
    if fault == "crash_before":
        log.warning("fault crash_before %s: exiting", tc.idempotency_key)
        os._exit(70)


def _invoke(ctx: Claimed, call: Call, tc: ToolCall, t: Tool) -> CallResult | Outcome:
    _attempt_start(ctx, tc, call)
    attempt = len(tc.attempts)
    tctx = ToolContext(str(ctx.run.pk), ctx.step.number, tc.index, tc.idempotency_key, attempt)
    started = time.perf_counter()
    try:
        result = call_with_timeout(ctx, t, tctx, call.args)
        error: BaseException | None = None
    except BaseException as exc:  # noqa: BLE001 — every failure is recorded
        result, error = None, exc
    if error is None:
        problem = storable.problem(
            result, max_bytes=settings.AGENTRUN_JSON_MAX_BYTES, what="the result"
        )
        if problem:
            result, error = None, ResultRefused(f"{tc.tool} ran, but {problem}")
    duration = (time.perf_counter() - started) * 1000
    if tc.attempts[-1].get("fault") == "crash_after":
        log.warning("fault crash_after %s: exiting", tc.idempotency_key)
        os._exit(71)
    tc.attempts[-1].update(ended=True, duration_ms=round(duration, 2))
    if error is None:
        tc.attempts[-1]["error"] = None
        tc.status, tc.result, tc.error, tc.finished_at = (
            ToolCallStatus.OK,
            storable.escape_redacted(result),  # escaped once, here
            "",
            timezone.now(),
        )
        if t.kind in SIDE_EFFECTS:
            _save_side_effect_result(ctx, tc, t)
        else:
            ctx.pending.append(tc)
        return result_of(tc, call)
    return _failed_attempt(ctx, call, tc, t, error)


def _save_side_effect_result(ctx: Claimed, tc: ToolCall, t: Tool) -> None:
    try:
        with transaction.atomic():
            guarded_update(ctx)
            flush_pending(ctx)
            tc.save(update_fields=["status", "result", "error", "attempts", "finished_at"])
    except LeaseLost:
        # Cancelled while the tool ran: undo a hybrid right away, or nobody will.
        run = Run.objects.get(pk=ctx.run.pk)
        if run.status in (RunStatus.CANCELLED, RunStatus.FAILED):
            tc.save(update_fields=["status", "result", "error", "attempts", "finished_at"])
            if t.kind == "hybrid":
                compensate_run(run)
        raise


def _failed_attempt(
    ctx: Claimed, call: Call, tc: ToolCall, t: Tool, error: BaseException
) -> Outcome:
    transient = getattr(error, "transient", False) or isinstance(
        error, (TimeoutError, ConnectionError)
    )
    attempt = len(tc.attempts)
    message = escape_text(f"{type(error).__name__}: {error}")
    tc.attempts[-1]["error"] = message
    tc.error = message
    if isinstance(error, Abandoned):
        tc.attempts[-1].update(abandoned=True, ended=False)  # its end was never seen
        if t.kind in SIDE_EFFECTS and not t.idempotent:
            # It may still land: only an operator can say whether to retry it.
            return park(ctx, tc, WaitReason.IN_DOUBT, ToolCallStatus.IN_DOUBT, "tool_call_in_doubt")
    if transient and attempt < t.retry.max_attempts:
        backoff = t.retry.delay(attempt)
        tc.attempts[-1]["backoff_s"] = backoff
        tc.status = ToolCallStatus.INTENT if t.kind in SIDE_EFFECTS else ToolCallStatus.PLANNED
        return back_off(ctx, tc, backoff, message)
    tc.status, tc.finished_at = ToolCallStatus.FAILED, timezone.now()
    ctx.pending.append(tc)
    failure = failure_context(ctx, error, where="tool", tool=tc.tool, input=tc.args)
    failure["attempts"] = attempt
    return fail_step(ctx, failure)
