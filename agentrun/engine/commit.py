"""Phase 4: the post snapshot and next step, committed with a compare-and-set."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from agentrun.agents import CallResult, Decision
from agentrun.engine.cache import cache_put
from agentrun.engine.compensate import compensate_run
from agentrun.engine.context import (
    CALL_FIELDS,
    Claimed,
    LeaseLost,
    Outcome,
    mark_saved,
    release_connection,
)
from agentrun.engine.lease import lease_end, lease_expiry, run_update
from agentrun.infra.queue import ask, enqueue
from agentrun.models import (
    Event,
    Run,
    RunStatus,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
)
from agentrun.security.redact import redact, redact_text
from agentrun.security.storable import escape, escape_text
from agentrun.store import callsearch, compaction, hashing, rawsql, snapshots
from agentrun.telemetry import tracing

log = logging.getLogger(__name__)


def failure_context(
    ctx: Claimed,
    exc: BaseException,
    *,
    where: str,
    tool: str | None = None,
    input: Any = None,
    detail: Any = None,
) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    failure = {
        "step": ctx.step.number,
        "where": where,
        "type": type(exc).__name__,
        "message": escape_text(str(exc)),
        "tool": tool,
        "traceback": escape_text(tb[-8000:]),
        "input": input,  # what the step had: stored already, escaped where it arrived
    }
    if detail is not None:
        failure["detail"] = escape(detail)
    return redact(failure)


def commit_step(ctx: Claimed, decision: Decision, results: list[CallResult]) -> Outcome:
    try:
        post_state = ctx.agent.update(ctx.pre_state, decision, results, ctx.sctx)
    except Exception as exc:  # the agent's own bug: this step is the failure, not a crash loop
        return fail_step(ctx, failure_context(ctx, exc, where="update"))
    try:
        # A state the agent's own schema refuses would fail the next step's decide,
        # and every one after it: it is refused here, at the step that produced it.
        ctx.agent.validate_state(post_state)
    except ValueError as exc:
        failure = failure_context(ctx, exc, where="update")
        failure["message"] = redact(
            f"step {ctx.step.number}'s update left a state the agent's schema refuses: {exc}"
        )
        return fail_step(ctx, failure)
    finished = decision.final is not None
    try:
        return _write_post(
            ctx,
            post_state,
            StepStatus.SUCCEEDED,
            RunStatus.SUCCEEDED if finished else RunStatus.RUNNING,
            final=decision.final,
            decision=decision,
        )
    except (UnicodeEncodeError, RecursionError) as exc:
        # Text that isn't UTF-8 (a lone surrogate the agent's code made) or a state
        # nested past Python's limits: nothing was written, and no retry would differ.
        failure = failure_context(ctx, exc, where="update")
        failure["message"] = redact(
            f"step {ctx.step.number}'s update left a state that can't be stored: {exc}"
        )
        return fail_step(ctx, failure)


def fail_step(ctx: Claimed, failure: dict[str, Any]) -> Outcome:
    """A step failed for good: post snapshot with the failure, run failed, compensate.

    The agent records the failure in its state; if that fails too (its state is
    what broke), the post snapshot is the pre state and the failure says both.
    """
    try:
        post_state = ctx.agent.fail(ctx.pre_state, failure, ctx.sctx)
    except Exception as exc:
        failure = {**failure, "fail_error": escape_text(f"{type(exc).__name__}: {exc}"[:2000])}
        post_state = ctx.pre_state
    ctx.failure = failure
    outcome = _write_post(ctx, post_state, StepStatus.FAILED, RunStatus.FAILED, failure=failure)
    if outcome.status == "failed":
        # The worker's log says why, not only that the task ended (its message is the
        # failure's, redacted and cut like the run's error).
        log.warning(
            "step %s of run %s failed: %s%s",
            ctx.step.number,
            ctx.run.pk,
            str(failure.get("type", "")) + ": " if failure.get("type") else "",
            redact_text(str(failure.get("message", "")))[:500],
        )
        compensate_run(Run.objects.get(pk=ctx.run.pk))
    return outcome


def _write_post(
    ctx: Claimed,
    post_state: dict[str, Any],
    step_status: str,
    run_status: str,
    *,
    final: str | None = None,
    decision: Decision | None = None,
    failure: dict[str, Any] | None = None,
) -> Outcome:
    now = timezone.now()
    number = ctx.step.number
    snap, node = snapshots.build(
        ctx.run.pk,
        number,
        "post",
        post_state,
        ctx.pre,
        ctx.pre_state,
        prev_node=ctx.pre_node,
        outcome=step_status,
    )
    terminal = run_status != RunStatus.RUNNING
    llm = (decision.llm if decision else None) or {}
    run_changes: dict[str, Any] = {
        "next_step": number + 1,
        "lease_owner": "",
        "lease_expires_at": None,
        "phase": snap.phase,
        "status": run_status,
        # Typed placeholders: psycopg sends an int as int2, int4 or int8 by its size, and
        # each type would be a statement of its own to prepare.
        "tokens_in": rawsql.Sql(
            f"tokens_in + {rawsql.slot(Run, 'tokens_in')}", (int(llm.get("tokens_in", 0)),)
        ),
        "tokens_out": rawsql.Sql(
            f"tokens_out + {rawsql.slot(Run, 'tokens_out')}", (int(llm.get("tokens_out", 0)),)
        ),
        "tokens_cached": rawsql.Sql(
            f"tokens_cached + {rawsql.slot(Run, 'tokens_cached')}",
            (int(llm.get("tokens_cached", 0)),),
        ),
        "cost_usd": rawsql.Sql(
            f"cost_usd + {rawsql.slot(Run, 'cost_usd')}", (float(llm.get("cost_usd") or 0.0),)
        ),
        "updated_at": now,
    }
    if terminal:
        run_changes["finished_at"] = now
    if final is not None:
        run_changes["final_answer"] = final
    if failure is not None:
        run_changes["error"] = failure.get("message", "")[:2000]
    if number + 1 - ctx.run.first_step >= settings.AGENTRUN_MAX_STEPS and not terminal:
        run_changes.update(status=RunStatus.FAILED, finished_at=now, error="step limit reached")
        terminal = True
    chain = not terminal and time.monotonic() < ctx.chain_until
    if chain:  # keep the lease, for the next step
        run_changes.update(lease_owner=ctx.owner, lease_expires_at=lease_end())
    # One guarded write: the compare-and-set on the run, then everything else.
    write = rawsql.Guarded(*run_update(ctx, run_changes))
    snap_values, snap_text = snapshots.insert_values(snap)
    write.insert(Snapshot, snap_values, returning=True)
    new_calls = [tc for tc in ctx.pending if tc.pk is None]
    for tc in ctx.pending:
        if tc.pk is None:
            values = rawsql.insert_fields(tc)
        else:
            values = {f: getattr(tc, f) for f in CALL_FIELDS}
        # A read's result is stored once: against the post delta that holds it. (Calls
        # with side effects outlive their run's snapshots in the audit: stored whole.)
        if tc.kind == "read":
            values["result"] = snapshots.pack_result(tc.result, snap, snap_text)
        if tc.pk is None:
            write.insert(ToolCall, values, returning=True)
        else:
            write.update(ToolCall, tc.pk, values)
    write.update(
        Step,
        ctx.step.pk,
        {
            "status": step_status,
            "phase_after": snap.phase,
            "failure": failure,
            "finished_at": now,
            "duration_ms": round((time.perf_counter() - ctx.started) * 1000, 3),
            "state_size": snap.size,
            # Until its spans' export is on record (absent: traces off, or not sampled).
            **tracing.export_pending(ctx.run, now),
        },
    )
    # A committed step is on record in its Step row and post snapshot; the event log
    # keeps what is more than progress: failures, waits, retries, operators' actions.
    if failure:
        _event(write, ctx, "step_failed", {"hash": snap.hash[:16], "phase": snap.phase}, now)
    if terminal:
        status_now = run_changes["status"]
        _event(
            write,
            ctx,
            f"run_{status_now}",
            {"error": run_changes.get("error", "")} if failure else {},
            now,
        )
    if chain:
        next_step = rawsql.instance(
            Step,
            {
                "run_id": ctx.run.pk,
                "number": number + 1,
                "status": StepStatus.RUNNING,
                "attempts": 1,
                "worker": ctx.owner,
                "code_version": ctx.run.code_version,
                "phase_before": snap.phase,
                "started_at": now,
            },
        )
        next_pre = snapshots.reference(ctx.run.pk, number + 1, "pre", snap)
        write.insert(Step, rawsql.insert_fields(next_step), returning=True)
        write.insert(Snapshot, rawsql.insert_fields(next_pre), returning=True)
    try:
        ids = write.execute()
    except IntegrityError as exc:
        raise LeaseLost(str(exc)) from exc
    if ids is None:
        raise LeaseLost(f"commit of step {number} refused")
    # Until its next write (a chained step's decision comes after a model call), the
    # step needs no connection: another step in this process can have it.
    release_connection()
    snapshots.committed(snap, snap_text)
    mark_saved(snap, ids[0])
    for tc, pk in zip(new_calls, ids[1 : 1 + len(new_calls)], strict=True):
        mark_saved(tc, pk)
    ctx.pending.clear()
    if chain:
        mark_saved(next_step, ids[-2])
        mark_saved(next_pre, ids[-1])
        ctx.next = _chained(ctx, next_step, next_pre, post_state, node, run_changes)
    elif not terminal:
        enqueue(ctx.run.pk, number + 1, version=ctx.run.target_version)
    else:  # a long run ended: its calls' text indexed, its deltas regrouped
        if ctx.run.batch_id is not None:  # a replay batch's fork: the batch goes on
            ask("agentrun.batch_advance", ctx.run.batch_id, "the batch's next forks")
        steps = number + 1 - ctx.run.first_step
        if 0 < settings.AGENTRUN_SEARCH_INDEX_STEPS <= steps:
            callsearch.send(ctx.run.pk)
        if 0 < settings.AGENTRUN_COMPACT_STEPS <= steps:
            compaction.send(ctx.run.pk)
    cache_put(str(ctx.run.pk), snap.seq, snap.hash, post_state, node, snap.size)
    status = "failed" if failure else ("finished" if terminal else "committed")
    return Outcome(status, str(ctx.run.pk), number)


def _chained(
    ctx: Claimed,
    step: Step,
    pre: Snapshot,
    state: dict[str, Any],
    node: hashing.Node,
    run_changes: dict[str, Any],
) -> Claimed:
    """The context of the step a commit just claimed: the run as that commit left it."""
    run = ctx.run
    run.next_step, run.phase, run.status = step.number, pre.phase, run_changes["status"]
    run.lease_owner, run.lease_expires_at = ctx.owner, lease_expiry()  # (the row's: the database's)
    return Claimed(
        run=run,
        step=step,
        agent=ctx.agent,
        owner=ctx.owner,
        pre_state=state,
        pre=pre,
        pre_node=node,
        chain_until=ctx.chain_until,
    )


def _event(
    write: rawsql.Guarded, ctx: Claimed, kind: str, payload: dict[str, Any], now: Any
) -> None:
    """Append a system event to a guarded write (cf. events.record_event)."""
    values = {
        "run_id": ctx.run.pk,
        "step": ctx.step.number,
        "kind": kind,
        "actor": "system",
        "user_id": None,
        "reason": "",
        "payload": redact(payload),
        "created_at": now,
    }
    write.insert(Event, values)
