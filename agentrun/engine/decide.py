"""Phase 2: the decision, stored before any tool runs and reused on a retry."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentrun.agents import Agent, AgentError, Call, Decision
from agentrun.audit.events import record_event
from agentrun.engine.commit import fail_step, failure_context
from agentrun.engine.context import (
    SIDE_EFFECTS,
    Claimed,
    LeaseLost,
    Outcome,
    mark_saved,
    release_connection,
    sorted_keys,
)
from agentrun.engine.lease import WATCHDOG, guarded_update, lease_guard
from agentrun.engine.waits import back_off
from agentrun.models import (
    ReplayMode,
    Snapshot,
    Step,
    ToolCall,
    ToolCallStatus,
)
from agentrun.security import storable
from agentrun.security.redact import redact
from agentrun.store import delta, rawsql
from agentrun.telemetry import llm_called
from agentrun.tools import RetryPolicy, get_tool

# A policy whose provider answered "try later" (429, 5xx, timeout) is asked again after this.
DECIDE_RETRY = RetryPolicy(max_attempts=4, initial=1.0, maximum=30.0)


# A provider that rate-limits with Retry-After is asked again up to this many times,
# waiting at most this long each time.
RATE_LIMITED_ATTEMPTS = 10


MAX_RETRY_AFTER = 600.0


def decide_step(ctx: Claimed) -> Decision | Outcome:
    if ctx.step.decision is not None:
        stored_decision = Decision.from_dict(sorted_keys(ctx.step.decision))
        stored_decision.checkpoint = ctx.step.checkpoint
        return stored_decision
    if (
        ctx.run.mode == ReplayMode.RECORDED
        and ctx.run.divergence_step is None
        and ctx.agent.replays_decisions
    ):
        replayed = _replay_decision(ctx)
        if replayed is not None:
            return replayed
    started = time.perf_counter()
    started_ns = time.time_ns()
    try:
        # A model may take seconds to answer: the step holds no database connection
        # meanwhile, and the process's one watchdog keeps its lease.
        release_connection()
        with WATCHDOG.watching(ctx):
            decision = ctx.agent.decide(ctx.pre_state, ctx.sctx)
        as_dict = decision.to_dict()
        problem = _shape_problem(decision, as_dict) or _check_decision(ctx.agent, decision)
    except AgentError as exc:
        retry = _decide_retry(ctx, exc)
        if retry is not None:
            return back_off(
                ctx,
                None,
                retry,
                storable.escape_text(f"decide: {exc}"),
                retry_after=exc.retry_after,
            )
        return fail_step(ctx, failure_context(ctx, exc, where="decide", detail=exc.detail))
    except Exception as exc:
        return fail_step(ctx, failure_context(ctx, exc, where="decide"))
    if problem:
        return fail_step(
            ctx,
            {
                "step": ctx.step.number,
                "type": "InvalidDecision",
                "message": problem,
                "tool": None,
                "traceback": "",
                "input": _preview(decision),
            },
        )
    latency = (time.perf_counter() - started) * 1000
    llm_called(ctx, started_ns, time.time_ns())
    # Escaped once, here: text the database can't hold, kept as the model sent it.
    stored = storable.escape_redacted(as_dict)
    llm = decision.llm or {}
    now = timezone.now()
    write = lease_guard(ctx, now)
    # A framework's record of the step (a LangGraph checkpoint) goes with the decision.
    record = {} if decision.checkpoint is None else {"checkpoint": decision.checkpoint}
    write.update(
        Step,
        ctx.step.pk,
        {
            **record,
            "decision": stored,
            "decided_at": now,
            "decision_count": rawsql.Sql("decision_count + 1"),
            "tokens_in": llm.get("tokens_in", 0),
            "tokens_out": llm.get("tokens_out", 0),
            "tokens_cached": llm.get("tokens_cached", 0),
            "cost_usd": llm.get("cost_usd"),
            "llm_latency_ms": llm.get("latency_ms", latency),
        },
    )
    # Work on exactly what was stored, as a retry would.
    checkpoint = decision.checkpoint
    decision = Decision.from_dict(sorted_keys(stored))
    decision.checkpoint = checkpoint
    ctx.calls = [_planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]
    # Calls that must be on record before they run: side effects (their intent)
    # and calls awaiting approval. A read call's row is written with its result.
    early = [tc for tc in ctx.calls if tc.kind in SIDE_EFFECTS or tc.requires_approval]
    for tc in early:
        write.insert(ToolCall, rawsql.insert_fields(tc), returning=True)
    # Look up the per-run read cache for this step's reads in the same round trip.
    cacheable = [tc for tc in ctx.calls if tc.kind == "read" and get_tool(tc.tool).cache]
    for tc in cacheable:
        write.select(ToolCall, *read_cache_query(ctx, tc))
    # Committed asynchronously: a worker that dies after this still finds the decision
    # (only the database server's own crash can lose it, and with it the step's commit,
    # which comes later), and the first synchronous commit after it (a side effect's
    # intent, or this step's commit) makes it durable before anything depends on it.
    ids = write.execute(sync=False)
    if ids is None:
        raise LeaseLost(f"run {ctx.run.pk} step {ctx.step.number}")
    for tc, pk in zip(early, ids[: len(early)], strict=True):
        mark_saved(tc, pk)
    ctx.read_hits = {tc.index: v for tc, v in zip(cacheable, ids[len(early) :], strict=True)}
    # The tools and the agent's update run without a connection; the commit takes one.
    release_connection()
    return decision


def _decide_retry(ctx: Claimed, exc: AgentError) -> float | None:
    """Seconds until a transient policy failure is tried again, or None: it failed for good.

    A provider that says when to come back (429 with Retry-After) is believed, and
    gets more attempts: being rate limited is the normal state of a busy deployment.
    """
    if not exc.transient:
        return None
    attempts = ctx.step.attempts
    if exc.retry_after is not None and math.isfinite(exc.retry_after):
        if attempts >= RATE_LIMITED_ATTEMPTS:
            return None
        return min(max(exc.retry_after, DECIDE_RETRY.delay(attempts)), MAX_RETRY_AFTER)
    return DECIDE_RETRY.delay(attempts) if attempts < DECIDE_RETRY.max_attempts else None


def calls_of(ctx: Claimed, decision: Decision) -> list[ToolCall]:
    """The step's tool calls: the ones on record, the rest (reads) as planned, unsaved."""
    if ctx.calls is not None:
        return ctx.calls
    stored = {tc.index: tc for tc in ToolCall.objects.filter(step=ctx.step)}
    return [stored.get(i) or _planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]


def _replay_decision(ctx: Claimed) -> Decision | None:
    """Recorded mode: reuse the parent's decision while the states still match.

    At the first step whose pre state differs from the parent's (or that the
    parent never reached), mark the divergence and go on in sandbox mode.
    """
    parent_pre = Snapshot.objects.filter(run_id=ctx.run.parent_id, seq=ctx.pre.seq).first()
    twin = Step.objects.filter(run_id=ctx.run.parent_id, number=ctx.step.number).first()
    if (
        parent_pre is None
        or twin is None
        or twin.decision is None
        or parent_pre.hash != ctx.pre.hash
    ):
        reason = (
            "the parent has no decided step here"
            if parent_pre is None or twin is None or twin.decision is None
            else "the state differs from the parent's"
        )
        with transaction.atomic():
            guarded_update(ctx, divergence_step=ctx.step.number)
            record_event("diverged", run=ctx.run, step=ctx.step.number, payload={"reason": reason})
        ctx.run.divergence_step = ctx.step.number
        return None
    stored = {
        **twin.decision,
        "replayed_from": {"run": str(ctx.run.parent_id), "step": twin.number},
    }
    decision = Decision.from_dict(sorted_keys(stored))
    with transaction.atomic():
        guarded_update(ctx)
        Step.objects.filter(pk=ctx.step.pk).update(decision=stored, decided_at=timezone.now())
        ctx.calls = ToolCall.objects.bulk_create(
            [_planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]
        )
    return decision


def _shape_problem(decision: Decision, as_dict: dict[str, Any] | None = None) -> str | None:
    """Why a decision can't be stored as it is (too deep, too large), or None.

    Text the database can't hold is no problem: redaction escapes it. The step
    fails instead of asking the model again, which would spend tokens for nothing.
    `as_dict`: decision.to_dict(), when the caller has it.
    """
    as_dict = decision.to_dict() if as_dict is None else as_dict
    max_bytes = settings.AGENTRUN_JSON_MAX_BYTES
    # One walk clears most decisions: the whole within the args' own depth limit, which
    # is the stricter one (the args sit three levels down: decision, calls, call).
    if storable.clears(as_dict, depth=storable.max_depth() + 3, max_bytes=max_bytes):
        return None
    for i, call in enumerate(decision.calls):
        problem = storable.problem(call.args, what=f"calls[{i}].args")
        if problem:
            return f"the decision can't be stored: {problem}"
    problem = storable.problem(
        as_dict,
        depth=storable.max_depth(state=True),
        max_bytes=max_bytes,
        what="decision",
        named="the decision",
    )
    return None if problem is None else f"the decision can't be stored: {problem}"


def _preview(decision: Decision, limit: int = 4000) -> Any:
    """The decision as a failure keeps it: whole if it can be stored, else its text's start."""
    if _shape_problem(decision) is None:
        return storable.escape_redacted(decision.to_dict())
    try:
        text = json.dumps(decision.to_dict(), ensure_ascii=False, default=str)
    except (RecursionError, ValueError):
        text = "(nested too deeply to show)"
    return redact(storable.escape_text(text[:limit] + ("…" if len(text) > limit else "")))


def _check_decision(agent: Agent, decision: Decision) -> str | None:
    if decision.final is not None and decision.calls:
        return "a decision has either tool calls or a final answer, not both"
    for i, call in enumerate(decision.calls):
        if agent.tools and call.tool not in agent.tools:
            return f"calls[{i}]: tool {call.tool!r} is not one of this agent's tools"
        try:
            t = get_tool(call.tool)
        except KeyError as exc:
            return f"calls[{i}]: {exc.args[0]}"
        problem = t.check_args(call.args)
        if problem:
            return f"calls[{i}] ({call.tool}): {problem}"
        if call.fault not in (None, "crash_before", "crash_after"):
            return f"calls[{i}]: unknown fault {call.fault!r}"
    return None


def idempotency_key(run_id: Any, step: int, index: int, tool: str, args_hash: str) -> str:
    return f"{run_id}:{step}:{index}:{tool}:{args_hash[:16]}"


def _planned_call(ctx: Claimed, index: int, call: Call) -> ToolCall:
    t = get_tool(call.tool)
    args = redact(call.args)
    args_hash = delta.state_hash(call.args)
    # Built as rawsql builds one (a step makes one per call; keyword arguments cost more).
    return rawsql.instance(
        ToolCall,
        {
            "run_id": ctx.run.pk,
            "step_id": ctx.step.pk,
            "index": index,
            "tool": call.tool,
            "kind": t.kind,
            "args": args,
            "args_hash": args_hash,
            "idempotency_key": idempotency_key(
                ctx.run.pk, ctx.step.number, index, call.tool, args_hash
            ),
            "status": ToolCallStatus.PLANNED,
            "requires_approval": call.approval or t.requires_approval,
        },
    )


def read_cache_query(ctx: Claimed, tc: ToolCall) -> tuple[str, list[Any]]:
    """The earliest successful result of the same read call in this run (not this one)."""
    params = [
        rawsql.prep(ToolCall, "run_id", ctx.run.pk),
        tc.tool,
        rawsql.prep(ToolCall, "args_hash", tc.args_hash),
        tc.pk or 0,
    ]
    sql = (
        f"SELECT {rawsql.column(ToolCall, 'result')} FROM {rawsql.table(ToolCall)}"
        " WHERE run_id = %s AND tool = %s AND args_hash = %s AND status = 'ok' AND id <> %s"
        " ORDER BY created_at LIMIT 1"
    )
    return sql, params
