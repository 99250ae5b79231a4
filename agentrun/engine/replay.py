"""Forks: recorded replay and sandboxed side effects, call by call."""

from __future__ import annotations

from django.utils import timezone

from agentrun.agents import Call, CallResult
from agentrun.engine.commit import fail_step
from agentrun.engine.context import DONE, Claimed, Outcome, result_of
from agentrun.models import (
    ReplayMode,
    Run,
    ToolCall,
    ToolCallStatus,
)


def replaying(ctx: Claimed) -> bool:
    return ctx.run.mode == ReplayMode.RECORDED and ctx.run.divergence_step is None


def is_sandboxed(ctx: Claimed) -> bool:
    """Sandbox forks, and recorded forks after their divergence, run no side effects."""
    return ctx.run.mode == ReplayMode.SANDBOX or (
        ctx.run.mode == ReplayMode.RECORDED and ctx.run.divergence_step is not None
    )


def _twin_call(ctx: Claimed, tc: ToolCall) -> ToolCall | None:
    """The parent's call at the aligned step: same position, tool and arguments."""
    if not ctx.run.parent_id:
        return None
    return ToolCall.objects.filter(
        run_id=ctx.run.parent_id,
        step__number=ctx.step.number,
        index=tc.index,
        tool=tc.tool,
        args_hash=tc.args_hash,
    ).first()


def replay_call(ctx: Claimed, call: Call, tc: ToolCall) -> CallResult | Outcome:
    twin = _twin_call(ctx, tc)
    if twin is None or twin.status not in (*DONE, ToolCallStatus.REPLAYED):
        return fail_step(
            ctx,
            {
                "step": ctx.step.number,
                "type": "ReplayMismatch",
                "tool": tc.tool,
                "message": f"the parent has no finished {tc.tool} call #{tc.index} at this step",
                "traceback": "",
                "input": tc.args,
            },
        )
    tc.status, tc.result, tc.error = ToolCallStatus.REPLAYED, twin.result, twin.error
    tc.finished_at = timezone.now()
    ctx.pending.append(tc)
    return replayed_result(ctx, call, tc)


def replayed_result(ctx: Claimed, call: Call, tc: ToolCall) -> CallResult:
    """A replayed call as the state saw it first: the original call's status and attempts."""
    result = result_of(tc, call)
    origin, run_id, depth = tc, ctx.run.pk, 0
    while origin.status == ToolCallStatus.REPLAYED and depth < 100:
        parent_id = Run.objects.filter(pk=run_id).values_list("parent_id", flat=True).first()
        found = ToolCall.objects.filter(
            run_id=parent_id, step__number=ctx.step.number, index=tc.index, args_hash=tc.args_hash
        ).first()
        if found is None:
            break
        origin, run_id, depth = found, parent_id, depth + 1
    # Compensation came after the state recorded the call as done.
    status = ToolCallStatus.OK if origin.status == ToolCallStatus.COMPENSATED else origin.status
    result.status, result.attempts = status, len(origin.attempts)
    return result


def skip_in_sandbox(ctx: Claimed, call: Call, tc: ToolCall) -> CallResult:
    """Sandbox forks never run side effects: reuse the parent's result if it made the same call."""
    twin = _twin_call(ctx, tc)
    parent_result = twin.result if twin is not None else None
    tc.status, tc.result, tc.finished_at = ToolCallStatus.SKIPPED, parent_result, timezone.now()
    ctx.pending.append(tc)
    return result_of(tc, call)
