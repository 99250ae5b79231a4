"""Executing one step of a run (DESIGN section 4).

`execute_step(run_id, n)` is what the Celery task calls. It claims the step
with a lease, writes the pre snapshot, gets the decision (once: a retried step
reuses the recorded one), runs the tool calls with intent → result records,
and commits the post snapshot with a compare-and-set on (next_step, lease
owner). No transaction is held open across a policy or tool call.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from agentrun import delta, hashing, rawsql, snapshots
from agentrun.agents import Agent, AgentError, Call, CallResult, Decision, StepContext, get_agent
from agentrun.events import record_event
from agentrun.models import (
    Event,
    ReplayMode,
    Run,
    RunStatus,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
    WaitReason,
)
from agentrun.redact import redact
from agentrun.tools import RetryPolicy, Tool, ToolContext, ToolError, get_tool

log = logging.getLogger(__name__)

CLAIMABLE = (RunStatus.QUEUED, RunStatus.RUNNING)
# A policy whose provider answered "try later" (429, 5xx, timeout) is asked again after this.
DECIDE_RETRY = RetryPolicy(max_attempts=4, initial=1.0, maximum=30.0)
# A provider that rate-limits with Retry-After is asked again up to this many times,
# waiting at most this long each time.
RATE_LIMITED_ATTEMPTS = 10
MAX_RETRY_AFTER = 600.0
SIDE_EFFECTS = ("write", "hybrid")


class LeaseLost(Exception):
    """Another worker owns this step now (we were too slow or a zombie)."""


@dataclass
class Outcome:
    """What one call of execute_step did, for tasks, tests and logs."""

    status: str  # not_claimed | committed | finished | waiting | backoff | failed | lost
    run_id: str
    step: int
    detail: str = ""


# --- the worker's cache of the latest state of each run ---------------------
# Saves rebuilding a state from keyframe + deltas at every step. Validated by
# the snapshot hash, so a stale entry is never used.
# Bounded by the states' bytes, not their number: a process with hundreds of runs in
# flight keeps each one's state, and a few huge states can't take all the memory.
_CACHE: OrderedDict[str, tuple[int, str, dict[str, Any], hashing.Node, int]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_cache_bytes = 0


def _cache_get(run_id: str, digest: str) -> tuple[dict[str, Any], hashing.Node] | None:
    """The cached latest state of a run, if it has this hash (a REF's is its target's)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(run_id)
        if hit and hit[1] == digest:
            _CACHE.move_to_end(run_id)
            return hit[2], hit[3]
    return None


def _cache_put(
    run_id: str, seq: int, digest: str, state: dict[str, Any], node: hashing.Node, size: int
) -> None:
    global _cache_bytes
    budget = settings.AGENTRUN_STATE_CACHE_MB * 1024 * 1024
    with _CACHE_LOCK:
        old = _CACHE.pop(run_id, None)
        _cache_bytes -= old[4] if old else 0
        _CACHE[run_id] = (seq, digest, state, node, size)
        _cache_bytes += size
        while _cache_bytes > budget and len(_CACHE) > 1:
            _cache_bytes -= _CACHE.popitem(last=False)[1][4]


def remember_state(run_id: Any, snap: Snapshot, state: dict[str, Any], node: hashing.Node) -> None:
    """Seed this process's cache with a state just written (e.g. a fork's first one)."""
    _cache_put(str(run_id), snap.seq, snap.hash, state, node, snap.size)


def new_lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _lease_expiry() -> Any:
    return timezone.now() + timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS)


# --- enqueueing --------------------------------------------------------------


def enqueue(run_id: Any, step: int, countdown: float | None = None) -> None:
    """Wake a worker for (run, step) once the current transaction commits.

    The message is only a wake-up: losing or duplicating it is harmless.
    """
    if not settings.AGENTRUN_ENQUEUE:
        return

    def send() -> None:
        from agentrun.tasks import execute_step_task

        try:
            execute_step_task.apply_async((str(run_id), step), countdown=countdown)
        except Exception:  # the reconciler will find the run
            log.exception("could not enqueue step %s of %s", step, run_id)

    transaction.on_commit(send)


# --- the step ----------------------------------------------------------------


@dataclass
class _Ctx:
    run: Run
    step: Step
    agent: Agent
    owner: str
    pre_state: dict[str, Any]
    pre: Snapshot
    pre_node: hashing.Node
    calls: list[ToolCall] | None = None  # the step's tool calls, when this attempt created them
    pending: list[ToolCall] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    # Go on with the next step under the same lease until this time.monotonic().
    chain_until: float = 0.0
    read_hits: dict[int, Any] = field(default_factory=dict)  # read cache, by call index
    next: _Ctx | None = None  # the next step, claimed by this one's commit

    @property
    def sctx(self) -> StepContext:
        return StepContext(str(self.run.pk), self.step.number, self.run.input, self.run.first_step)


def execute_step(
    run_id: Any,
    number: int,
    owner: str | None = None,
    *,
    chain: float = 0.0,
    observe: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Run step `number` of a run, if it is due and nobody else holds it.

    With `chain` seconds, a step that commits within that time from the start
    also claims the next step in the same statement and this call goes on with
    it: no broker round trip and no separate claim between the steps of a
    run. Each step is still claimed, decided and committed as one (a crash
    mid-chain loses only the lease, which expires). Returns the last step's
    outcome; `observe` sees each one as it commits.
    """
    owner = owner or new_lease_owner()
    ctx = claim(str(run_id), number, owner)
    if ctx is None:
        return Outcome("not_claimed", str(run_id), number)
    ctx.chain_until = time.monotonic() + chain if chain > 0 else 0.0
    while True:
        try:
            outcome = _run_claimed(ctx)
        except LeaseLost as exc:
            log.warning("step %s of %s: lease lost (%s)", ctx.step.number, run_id, exc)
            return Outcome("lost", str(run_id), ctx.step.number, str(exc))
        if observe is not None:
            observe(outcome)
        if ctx.next is None:
            return outcome
        ctx = ctx.next


def claim(run_id: str, number: int, owner: str) -> _Ctx | None:
    """Take the lease on (run, step) and make sure its pre snapshot exists."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        claimed = _claim_pg(run_id, number, owner, now)
        if claimed is None:
            return None
        run, step, pre = claimed
    else:
        with transaction.atomic():
            run = _claim_run(run_id, number, owner, now)
            if run is None:
                return None
            step, pre = None, None
    agent = get_agent(run.agent)
    if pre is None:
        pre, pre_state, pre_node = _ensure_pre_snapshot(run, number, agent)
    else:
        pre_state, pre_node = _state_of(str(run.pk), pre)
    if step is None:
        step = _upsert_step(run, number, str(pre_state.get("phase", "")), now)
    elif step.attempts == 1 and step.phase_before != pre.phase:
        # The run's very first step: its pre snapshot was only just written.
        step.phase_before = pre.phase
        step.save(update_fields=["phase_before"])
    return _Ctx(
        run=run,
        step=step,
        agent=agent,
        owner=owner,
        pre_state=pre_state,
        pre=pre,
        pre_node=pre_node,
    )


_DUE = (
    "next_step = %s AND (status IN ('queued', 'running') OR (status = 'waiting'"
    " AND wait_reason = 'backoff')) AND (lease_expires_at IS NULL OR lease_expires_at < %s)"
    " AND (wake_at IS NULL OR wake_at <= %s)"
)


def _claim_set(run_id: str, number: int, owner: str, now: Any) -> tuple[str, list[Any]]:
    """The claim as `UPDATE run SET ... WHERE <due>` and its parameters."""
    params = [
        owner,
        rawsql.prep(
            Run, "lease_expires_at", now + timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS)
        ),
        rawsql.prep(Run, "started_at", now),
        rawsql.prep(Run, "updated_at", now),
        rawsql.prep(Run, "id", run_id),
        number,
        rawsql.prep(Run, "lease_expires_at", now),
        rawsql.prep(Run, "wake_at", now),
    ]
    return _claim_sql(), params


@cache
def _claim_sql() -> str:
    return (
        f"UPDATE {rawsql.table(Run)} SET status = 'running', wait_reason = '', wake_at = NULL,"
        " lease_owner = %s, lease_expires_at = %s, started_at = COALESCE(started_at, %s),"
        f" updated_at = %s WHERE id = %s AND {_DUE}"
    )


def _claim_run(run_id: str, number: int, owner: str, now: Any) -> Run | None:
    sql, params = _claim_set(run_id, number, owner, now)
    names = rawsql.attnames(Run)
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {rawsql.select_list(Run)}", params)
        row = cursor.fetchone()
    return None if row is None else rawsql.from_row(Run, names, row)


@cache
def _claim_pg_sql() -> tuple[str, tuple[str, ...]]:
    """The one-statement claim (see _claim_pg) and the snapshot columns it returns."""
    snap_names = tuple(n for n in rawsql.attnames(Snapshot) if n != "data")
    fixed = {
        "step": "%s::integer",
        "at": "'pre'",
        "seq": "%s::integer",
        "kind": "'ref'",
        "data": "NULL",
        "stored_bytes": "0",
        "outcome": "''",
        "created_at": "%s::timestamptz",
    }
    ref_cols = [f for f in Snapshot._meta.concrete_fields if not f.primary_key]
    insert_cols = ", ".join(rawsql.column(Snapshot, f.attname) for f in ref_cols)
    insert_vals = ", ".join(
        fixed.get(f.attname, "l." + rawsql.column(Snapshot, f.attname)) for f in ref_cols
    )
    returning = ", ".join(rawsql.column(Snapshot, n) for n in snap_names)
    snap_t, step_t = rawsql.table(Snapshot), rawsql.table(Step)
    statement = (
        f"WITH {rawsql.ASYNC_COMMIT}, r AS ({_claim_sql()} RETURNING {rawsql.select_list(Run)}), "
        f"s AS (INSERT INTO {step_t} (run_id, number, status, attempts, phase_before, phase_after,"
        " decision_count, tokens_in, tokens_out, started_at)"
        " SELECT r.id, %s::integer, 'running', 1, COALESCE((SELECT phase FROM"
        f" {snap_t} WHERE run_id = r.id AND seq <= %s::integer ORDER BY seq DESC LIMIT 1), ''),"
        " '', 0, 0, 0, %s::timestamptz FROM r"
        " ON CONFLICT (run_id, number) DO UPDATE SET"
        f" attempts = {step_t}.attempts + 1, status = 'running'"
        f" RETURNING {rawsql.select_list(Step)}), "
        f"p AS (INSERT INTO {snap_t} ({insert_cols}) SELECT {insert_vals} FROM r,"
        f" LATERAL (SELECT * FROM {snap_t} WHERE run_id = r.id AND seq < %s::integer"
        " ORDER BY seq DESC LIMIT 1) l"
        f" ON CONFLICT (run_id, seq) DO NOTHING RETURNING {returning}) "
        "SELECT r.*, s.*, p.* FROM cfg CROSS JOIN r CROSS JOIN s LEFT JOIN p ON true"
    )
    return statement, snap_names


def _claim_pg(
    run_id: str, number: int, owner: str, now: Any
) -> tuple[Run, Step, Snapshot | None] | None:
    """The claim in one statement: lease, step row (or one more attempt), pre snapshot.

    The pre snapshot is written as a REF to the latest snapshot before it when
    there is one and the pre doesn't exist yet; otherwise (first step, a retried
    step, a fork's first step) the caller finds or builds it.
    Commits asynchronously: a claim lost in a database crash costs nothing,
    and every later synchronous commit flushes it.
    """
    sql, params = _claim_set(run_id, number, owner, now)
    seq = Snapshot.seq_for(number, "pre")
    params += [
        number,
        seq,  # phase_before: the phase of the latest snapshot at or before the pre
        rawsql.prep(Step, "started_at", now),
        number,
        seq,
        rawsql.prep(Snapshot, "created_at", now),
        seq,
    ]
    statement, snap_names = _claim_pg_sql()
    step_names, run_names = rawsql.attnames(Step), rawsql.attnames(Run)
    row = rawsql.run_statement(statement, params)
    if row is None:
        log.debug("step %s of %s is not claimable now", number, run_id)
        return None
    a, b = len(run_names), len(run_names) + len(step_names)
    run = rawsql.from_row(Run, run_names, row[:a])
    step = rawsql.from_row(Step, step_names, row[a:b])
    pre = None
    if row[b] is not None:
        pre = rawsql.from_row(Snapshot, snap_names, row[b:])
    return run, step, pre


_STEP_UPSERT = """
INSERT INTO agentrun_step (run_id, number, status, attempts, phase_before, phase_after,
    decision_count, tokens_in, tokens_out, started_at)
VALUES (%s, %s, 'running', 1, %s, '', 0, 0, 0, %s)
ON CONFLICT (run_id, number) DO UPDATE SET attempts = agentrun_step.attempts + 1, status = 'running'
RETURNING *
"""


def _upsert_step(run: Run, number: int, phase_before: str, now: Any) -> Step:
    """Create the step, or count one more attempt at it: one statement."""
    run_id = run.pk.hex if connection.vendor == "sqlite" else run.pk
    return list(Step.objects.raw(_STEP_UPSERT, [run_id, number, phase_before, now]))[0]


def _ensure_pre_snapshot(
    run: Run, number: int, agent: Agent
) -> tuple[Snapshot, dict[str, Any], hashing.Node]:
    seq = Snapshot.seq_for(number, "pre")
    # Without data: a keyframe's state is only read when this worker hasn't cached it.
    latest = Snapshot.objects.filter(run=run, seq__lte=seq).defer("data").order_by("-seq").first()
    if latest is not None and latest.seq == seq:
        return (latest, *_state_of(str(run.pk), latest))
    if latest is None:
        state = agent.initial_state(run.input)
        snap, node = snapshots.build(run.pk, number, "pre", state, None, None)
    else:
        state, node = _state_of(str(run.pk), latest)
        snap = snapshots.reference(run.pk, number, "pre", latest)
    snap.save()
    _cache_put(str(run.pk), snap.seq, snap.hash, state, node, snap.size)
    return snap, state, node


def _state_of(run_id: str, snap: Snapshot) -> tuple[dict[str, Any], hashing.Node]:
    """A snapshot's state and hash tree: from this worker's cache, else rebuilt from the store."""
    cached = _cache_get(run_id, snap.hash)
    if cached is not None:
        return cached
    state = snapshots.load_state(snap)
    node = hashing.build(state)
    _cache_put(run_id, snap.seq, snap.hash, state, node, snap.size)
    return state, node


def _guarded(ctx: _Ctx, **changes: Any) -> None:
    """Extend our lease (and apply changes) only if we still hold it. In a transaction."""
    n = Run.objects.filter(
        pk=ctx.run.pk, next_step=ctx.step.number, lease_owner=ctx.owner, status=RunStatus.RUNNING
    ).update(**{"lease_expires_at": _lease_expiry(), "updated_at": timezone.now(), **changes})
    if n != 1:
        raise LeaseLost(f"run {ctx.run.pk} step {ctx.step.number}")


_CALL_FIELDS = ["status", "result", "error", "attempts", "finished_at", "from_cache"]


def _save_call(tc: ToolCall, fields: list[str]) -> None:
    """Save these fields of a call; a read call not yet on record is inserted whole."""
    if tc.pk is None:
        tc.save()
    else:
        tc.save(update_fields=fields)


def _flush_pending(ctx: _Ctx) -> None:
    for tc in ctx.pending:
        _save_call(tc, _CALL_FIELDS)
    ctx.pending.clear()


def _run_claimed(ctx: _Ctx) -> Outcome:
    decision = _decide(ctx)
    if isinstance(decision, Outcome):
        return decision
    calls = _calls_of(ctx, decision)
    results: list[CallResult] = []
    for call, tc in zip(decision.calls, calls, strict=True):
        outcome = _act(ctx, call, tc)
        if isinstance(outcome, Outcome):
            return outcome
        results.append(outcome)
    return _commit(ctx, decision, results)


# --- decide --------------------------------------------------------------------


def _decide(ctx: _Ctx) -> Decision | Outcome:
    if ctx.step.decision is not None:
        return Decision.from_dict(sorted_keys(ctx.step.decision))
    if ctx.run.mode == ReplayMode.RECORDED and ctx.run.divergence_step is None:
        replayed = _replay_decision(ctx)
        if replayed is not None:
            return replayed
    started = time.perf_counter()
    try:
        # A model may take seconds to answer: the step holds no database connection
        # meanwhile, and the process's one watchdog keeps its lease.
        release_connection()
        with _WATCHDOG.watching(ctx):
            decision = ctx.agent.decide(ctx.pre_state, ctx.sctx)
        problem = _check_decision(ctx.agent, decision)
    except AgentError as exc:
        retry = _decide_retry(ctx, exc)
        if retry is not None:
            return _backoff(ctx, None, retry, f"decide: {exc}", retry_after=exc.retry_after)
        return _fail(ctx, _failure(ctx, exc, where="decide", detail=exc.detail))
    except Exception as exc:
        return _fail(ctx, _failure(ctx, exc, where="decide"))
    if problem:
        return _fail(
            ctx,
            {
                "step": ctx.step.number,
                "type": "InvalidDecision",
                "message": problem,
                "tool": None,
                "traceback": "",
                "input": redact(decision.to_dict()),
            },
        )
    latency = (time.perf_counter() - started) * 1000
    stored = redact(decision.to_dict())
    llm = decision.llm or {}
    now = timezone.now()
    write = _lease_guard(ctx, now)
    write.update(
        Step,
        ctx.step.pk,
        {
            "decision": stored,
            "decided_at": now,
            "decision_count": rawsql.Sql("decision_count + 1"),
            "tokens_in": llm.get("tokens_in", 0),
            "tokens_out": llm.get("tokens_out", 0),
            "llm_latency_ms": llm.get("latency_ms", latency),
        },
    )
    ctx.calls = [_planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]
    # Calls that must be on record before they run: side effects (their intent)
    # and calls awaiting approval. A read call's row is written with its result.
    early = [tc for tc in ctx.calls if tc.kind in SIDE_EFFECTS or tc.requires_approval]
    for tc in early:
        write.insert(ToolCall, rawsql.insert_fields(tc), returning=True)
    # Look up the per-run read cache for this step's reads in the same round trip.
    cacheable = [tc for tc in ctx.calls if tc.kind == "read" and get_tool(tc.tool).cache]
    for tc in cacheable:
        write.select(ToolCall, *_read_cache_query(ctx, tc))
    # Committed asynchronously: a worker that dies after this still finds the decision
    # (only the database server's own crash can lose it, and with it the step's commit,
    # which comes later), and the first synchronous commit after it (a side effect's
    # intent, or this step's commit) makes it durable before anything depends on it.
    ids = write.execute(sync=False)
    if ids is None:
        raise LeaseLost(f"run {ctx.run.pk} step {ctx.step.number}")
    for tc, pk in zip(early, ids[: len(early)], strict=True):
        _saved(tc, pk)
    ctx.read_hits = {tc.index: v for tc, v in zip(cacheable, ids[len(early) :], strict=True)}
    # Work on exactly what was stored, as a retry would.
    return Decision.from_dict(sorted_keys(stored))


def _decide_retry(ctx: _Ctx, exc: AgentError) -> float | None:
    """Seconds until a transient policy failure is tried again, or None: it failed for good.

    A provider that says when to come back (429 with Retry-After) is believed, and
    gets more attempts: being rate limited is the normal state of a busy deployment.
    """
    if not exc.transient:
        return None
    attempts = ctx.step.attempts
    if exc.retry_after is not None:
        if attempts >= RATE_LIMITED_ATTEMPTS:
            return None
        return min(max(exc.retry_after, DECIDE_RETRY.delay(attempts)), MAX_RETRY_AFTER)
    return DECIDE_RETRY.delay(attempts) if attempts < DECIDE_RETRY.max_attempts else None


def release_connection() -> None:
    """Hand this thread's database connection back to the pool before a long wait.

    With a pool (PostgreSQL, DB_POOL_MAX_SIZE > 0) a checkout costs ~30 µs, so a
    step returns its connection before every call to a model or a tool and takes
    one again for its next write: connections per process stay at the pool's size
    however many steps are in flight. Without a pool (SQLite), or inside a
    transaction, the connection stays.
    """
    if connection.connection is None or connection.in_atomic_block:
        return
    if getattr(connection, "pool", None) is not None:
        connection.close()


def _lease_guard(ctx: _Ctx, now: Any, **changes: Any) -> rawsql.Guarded:
    """A guarded write that extends our lease (and applies `changes` to the run)."""
    sql, params = _run_update(
        ctx,
        {
            "lease_expires_at": now + timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS),
            "updated_at": now,
            **changes,
        },
    )
    return rawsql.Guarded(sql, params)


def _run_update(ctx: _Ctx, changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """`UPDATE run SET changes` if we still hold the lease on this step."""
    params: list[Any] = []
    for name, value in changes.items():
        if not isinstance(value, rawsql.Sql):
            params.append(rawsql.prep(Run, name, value))
    params += [rawsql.prep(Run, "id", ctx.run.pk), ctx.step.number, ctx.owner]
    shape = tuple((n, v.text if isinstance(v, rawsql.Sql) else None) for n, v in changes.items())
    return _run_update_sql(shape), params


@cache
def _run_update_sql(shape: tuple[tuple[str, str | None], ...]) -> str:
    sets = ", ".join(
        f"{rawsql.column(Run, name)} = {raw or rawsql.slot(Run, name)}" for name, raw in shape
    )
    return (
        f"UPDATE {rawsql.table(Run)} SET {sets} WHERE id = %s AND next_step = %s"
        " AND lease_owner = %s AND status = 'running'"
    )


def _saved(obj: Any, pk: Any) -> None:
    """Mark an object inserted with raw SQL as saved, with its new primary key."""
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = connection.alias


def _calls_of(ctx: _Ctx, decision: Decision) -> list[ToolCall]:
    """The step's tool calls: the ones on record, the rest (reads) as planned, unsaved."""
    if ctx.calls is not None:
        return ctx.calls
    stored = {tc.index: tc for tc in ToolCall.objects.filter(step=ctx.step)}
    return [stored.get(i) or _planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]


def _replay_decision(ctx: _Ctx) -> Decision | None:
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
            _guarded(ctx, divergence_step=ctx.step.number)
            record_event("diverged", run=ctx.run, step=ctx.step.number, payload={"reason": reason})
        ctx.run.divergence_step = ctx.step.number
        return None
    stored = {
        **twin.decision,
        "replayed_from": {"run": str(ctx.run.parent_id), "step": twin.number},
    }
    decision = Decision.from_dict(sorted_keys(stored))
    with transaction.atomic():
        _guarded(ctx)
        Step.objects.filter(pk=ctx.step.pk).update(decision=stored, decided_at=timezone.now())
        ctx.calls = ToolCall.objects.bulk_create(
            [_planned_call(ctx, i, call) for i, call in enumerate(decision.calls)]
        )
    return decision


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


def _planned_call(ctx: _Ctx, index: int, call: Call) -> ToolCall:
    t = get_tool(call.tool)
    args = redact(call.args)
    args_hash = delta.state_hash(call.args)
    return ToolCall(
        run=ctx.run,
        step=ctx.step,
        index=index,
        tool=call.tool,
        kind=t.kind,
        args=args,
        args_hash=args_hash,
        idempotency_key=idempotency_key(ctx.run.pk, ctx.step.number, index, call.tool, args_hash),
        status=ToolCallStatus.PLANNED,
        requires_approval=call.approval or t.requires_approval,
    )


# --- act -------------------------------------------------------------------------

_DONE = (ToolCallStatus.OK, ToolCallStatus.SKIPPED, ToolCallStatus.COMPENSATED)


def sorted_keys(value: Any) -> Any:
    """`value` with every object's keys in sorted order.

    What the agent sees must not depend on where it came from: jsonb hands
    objects back in its own key order, and an agent that serialises a result
    would otherwise build a different state on a retry or a replay.
    """
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def _result_of(tc: ToolCall, call: Call) -> CallResult:
    return CallResult(
        index=tc.index,
        tool=tc.tool,
        kind=tc.kind,
        args=sorted_keys(tc.args),
        status=tc.status,
        result=sorted_keys(tc.result),
        error=tc.error or None,
        attempts=len(tc.attempts),
        call_id=call.call_id,
    )


def _act(ctx: _Ctx, call: Call, tc: ToolCall) -> CallResult | Outcome:
    t = get_tool(call.tool)
    if tc.status in _DONE:
        return _result_of(tc, call)
    if tc.status == ToolCallStatus.REPLAYED:
        return _replayed(ctx, call, tc)
    if _replaying(ctx):
        return _replay_call(ctx, call, tc)
    if _sandboxed(ctx) and t.kind in SIDE_EFFECTS:
        return _skip_in_sandbox(ctx, call, tc)
    if tc.requires_approval:
        approval = tc.approval or {}
        if not approval:
            return _park(
                ctx, tc, WaitReason.APPROVAL, ToolCallStatus.AWAITING_APPROVAL, "approval_requested"
            )
        if approval.get("decision") == "reject":
            with transaction.atomic():
                _guarded(ctx)
                tc.status = ToolCallStatus.REJECTED
                _save_call(tc, ["status"])
            return _fail(
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
                _guarded(ctx)
                tc.status, tc.finished_at = ToolCallStatus.OK, timezone.now()
                tc.save(update_fields=["status", "finished_at"])
            return _result_of(tc, call)
        if not t.idempotent and resolution != "retry" and _was_invoked(tc):
            return _park(
                ctx, tc, WaitReason.IN_DOUBT, ToolCallStatus.IN_DOUBT, "tool_call_in_doubt"
            )
    if t.kind in SIDE_EFFECTS and tc.status != ToolCallStatus.INTENT:
        if (tc.approval or {}).get("resolution") == "retry":
            # The operator's "retry" is for this one attempt: a new doubt asks again.
            tc.approval = {**tc.approval, "resolution": "retried"}
        with transaction.atomic():
            _guarded(ctx)
            _flush_pending(ctx)
            tc.status = ToolCallStatus.INTENT
            tc.save(update_fields=["status", "approval"])
    return _invoke(ctx, call, tc, t)


def _was_invoked(tc: ToolCall) -> bool:
    """Intent recorded and an attempt started that never recorded its end."""
    return any(
        a.get("started") and not a.get("ended") and a.get("fault") != "crash_before"
        for a in tc.attempts
    )


def _read_cache_query(ctx: _Ctx, tc: ToolCall) -> tuple[str, list[Any]]:
    """The earliest successful result of the same read call in this run (not this one)."""
    params = [rawsql.prep(ToolCall, "run_id", ctx.run.pk), tc.tool, tc.args_hash, tc.pk or 0]
    sql = (
        f"SELECT {rawsql.column(ToolCall, 'result')} FROM {rawsql.table(ToolCall)}"
        " WHERE run_id = %s AND tool = %s AND args_hash = %s AND status = 'ok' AND id <> %s"
        " ORDER BY created_at LIMIT 1"
    )
    return sql, params


def _read_cache(ctx: _Ctx, call: Call, tc: ToolCall) -> CallResult | None:
    """The result of the same read call made earlier in this run, if any."""
    if tc.index in ctx.read_hits:  # looked up with the decision
        raw = ctx.read_hits.pop(tc.index)
    else:
        with connection.cursor() as cursor:
            cursor.execute(*_read_cache_query(ctx, tc))
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
    return _result_of(tc, call)


def _replaying(ctx: _Ctx) -> bool:
    return ctx.run.mode == ReplayMode.RECORDED and ctx.run.divergence_step is None


def _sandboxed(ctx: _Ctx) -> bool:
    """Sandbox forks, and recorded forks after their divergence, run no side effects."""
    return ctx.run.mode == ReplayMode.SANDBOX or (
        ctx.run.mode == ReplayMode.RECORDED and ctx.run.divergence_step is not None
    )


def _twin_call(ctx: _Ctx, tc: ToolCall) -> ToolCall | None:
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


def _replay_call(ctx: _Ctx, call: Call, tc: ToolCall) -> CallResult | Outcome:
    twin = _twin_call(ctx, tc)
    if twin is None or twin.status not in (*_DONE, ToolCallStatus.REPLAYED):
        return _fail(
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
    return _replayed(ctx, call, tc)


def _replayed(ctx: _Ctx, call: Call, tc: ToolCall) -> CallResult:
    """A replayed call as the state saw it first: the original call's status and attempts."""
    result = _result_of(tc, call)
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


def _skip_in_sandbox(ctx: _Ctx, call: Call, tc: ToolCall) -> CallResult:
    """Sandbox forks never run side effects: reuse the parent's result if it made the same call."""
    twin = _twin_call(ctx, tc)
    parent_result = twin.result if twin is not None else None
    tc.status, tc.result, tc.finished_at = ToolCallStatus.SKIPPED, parent_result, timezone.now()
    ctx.pending.append(tc)
    return _result_of(tc, call)


def _attempt_start(ctx: _Ctx, tc: ToolCall, call: Call) -> None:
    """Record that an attempt starts; arms a scripted fault on the first attempt."""
    first = not tc.attempts
    tc.attempts = [*tc.attempts, {"at": timezone.now().isoformat(), "started": True}]
    fault = call.fault if (first and settings.AGENTRUN_FAULTS) else None
    if fault:
        tc.attempts[-1]["fault"] = fault
    if tc.kind in SIDE_EFFECTS or fault:
        with transaction.atomic():
            _guarded(ctx)
            _flush_pending(ctx)
            _save_call(tc, ["attempts", "status"])
    if fault == "crash_before":
        log.warning("fault crash_before %s: exiting", tc.idempotency_key)
        os._exit(70)


def _invoke(ctx: _Ctx, call: Call, tc: ToolCall, t: Tool) -> CallResult | Outcome:
    _attempt_start(ctx, tc, call)
    attempt = len(tc.attempts)
    tctx = ToolContext(str(ctx.run.pk), ctx.step.number, tc.index, tc.idempotency_key, attempt)
    started = time.perf_counter()
    try:
        result = _call_with_timeout(ctx, t, tctx, call.args)
        error: BaseException | None = None
    except BaseException as exc:  # noqa: BLE001 — every failure is recorded
        result, error = None, exc
    duration = (time.perf_counter() - started) * 1000
    if tc.attempts[-1].get("fault") == "crash_after":
        log.warning("fault crash_after %s: exiting", tc.idempotency_key)
        os._exit(71)
    tc.attempts[-1].update(ended=True, duration_ms=round(duration, 2))
    if error is None:
        tc.attempts[-1]["error"] = None
        tc.status, tc.result, tc.error, tc.finished_at = (
            ToolCallStatus.OK,
            redact(result),
            "",
            timezone.now(),
        )
        if t.kind in SIDE_EFFECTS:
            _save_side_effect_result(ctx, tc, t)
        else:
            ctx.pending.append(tc)
        return _result_of(tc, call)
    return _failed_attempt(ctx, call, tc, t, error)


def _save_side_effect_result(ctx: _Ctx, tc: ToolCall, t: Tool) -> None:
    try:
        with transaction.atomic():
            _guarded(ctx)
            _flush_pending(ctx)
            tc.save(update_fields=["status", "result", "error", "attempts", "finished_at"])
    except LeaseLost:
        # Cancelled while the tool ran: undo a hybrid right away, or nobody will.
        run = Run.objects.get(pk=ctx.run.pk)
        if run.status in (RunStatus.CANCELLED, RunStatus.FAILED):
            tc.save(update_fields=["status", "result", "error", "attempts", "finished_at"])
            if t.kind == "hybrid":
                compensate_run(run)
        raise


_POOL: tuple[int, ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _tool_pool() -> ThreadPoolExecutor:
    """Threads for tool calls made off the main thread: as many as steps in flight
    (started on demand), so a slow tool never queues behind another run's."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            size = max(settings.AGENTRUN_WORKER_CONCURRENCY, 4) + 4
            _POOL = (os.getpid(), ThreadPoolExecutor(size, thread_name_prefix="agentrun-tool"))
        return _POOL[1]


class Abandoned(ToolError):
    """A tool call past its timeout in a thread that can't be stopped: it may still
    finish, so a side effect it was making is in doubt."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


def _in_pool(t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    """A tool call in a pool thread. The thread keeps its own database connection
    (a tool may use the ORM): check it as Django does around a request, so a
    connection broken by a database restart is replaced, not reused forever."""
    close_old_connections()
    try:
        return t(tctx, args)
    finally:
        close_old_connections()


def _call_with_timeout(ctx: _Ctx, t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    """Run the tool, keeping our lease while it works and stopping it at its timeout.

    In a process's main thread (a prefork or solo worker, the in-process executor)
    the tool runs right here: SIGALRM at its deadline raises a transient ToolError
    inside it, as Celery's soft time limit does, so a timed-out call is *stopped*.
    Other threads (the default threads pool) have no signals and Python can't stop
    a thread: there the tool runs in a pool thread that the step stops waiting for
    at the deadline. That call is *abandoned* (it may still finish): a read is
    retried, a side effect is in doubt unless its tool is idempotent. Either way the
    step holds no database connection while the tool works, and the lease watchdog
    renews its lease.
    """
    release_connection()
    with _WATCHDOG.watching(ctx):
        if t.timeout <= 0:
            return t(tctx, args)
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            return _with_alarm(t, tctx, args)
        future = _tool_pool().submit(_in_pool, t, tctx, args)
        try:
            return future.result(timeout=t.timeout)
        except FutureTimeout:
            raise Abandoned(
                f"{t.name} timed out after {t.timeout:g}s and was abandoned (it may still finish)"
            ) from None


def _timed_out(t: Tool) -> ToolError:
    return ToolError(f"{t.name} timed out after {t.timeout:g}s", transient=True)


def _with_alarm(t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    def alarm(signum: int, frame: Any) -> None:
        raise _timed_out(t)

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, t.timeout)
    try:
        return t(tctx, args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)


class _LeaseWatchdog:
    """One thread per process that renews the leases of the steps waiting on a model
    or a tool, all of them in one statement per beat, however many are in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[int, list[Any]] = {}  # key: [ctx, next renewal (monotonic)]
        self._keys = iter(range(1, 1 << 62))
        self._pid = 0

    @contextmanager
    def watching(self, ctx: _Ctx) -> Iterator[None]:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: threads don't fork
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="agentrun-lease", daemon=True).start()
            key = next(self._keys)
            self._steps[key] = [ctx, time.monotonic() + _beat()]
        try:
            yield
        finally:
            with self._lock:
                self._steps.pop(key, None)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._steps)

    def _run(self) -> None:
        while True:
            time.sleep(_beat() / 2)
            now = time.monotonic()
            with self._lock:
                due = [entry for entry in self._steps.values() if entry[1] <= now]
                for entry in due:
                    entry[1] = now + _beat()
            if not due:
                continue
            try:
                _renew([ctx for ctx, _ in due])
            except Exception:  # logged; each step's next guarded write decides
                log.exception("lease renewal of %d steps", len(due))
            finally:
                close_old_connections()  # back to the pool between beats


def _beat() -> float:
    return max(settings.AGENTRUN_LEASE_SECONDS / 3, 0.05)


def _renew(steps: list[_Ctx]) -> None:
    """Extend the leases of these steps, in batches of one UPDATE each.

    A lease owner names one claim (host, pid and a random part), so the owner and
    the running status are enough to find the step's run row: a run whose lease
    was taken over or that was cancelled is left alone, and that step's next
    guarded write stops it.
    """
    expiry = _lease_expiry()
    for i in range(0, len(steps), 500):
        batch = steps[i : i + 500]
        owners = {ctx.owner for ctx in batch}
        n = Run.objects.filter(lease_owner__in=owners, status=RunStatus.RUNNING).update(
            lease_expires_at=expiry
        )
        if n < len(owners):
            log.warning(
                "lease renewal: %d of %d steps have lost their lease", len(owners) - n, len(owners)
            )


_WATCHDOG = _LeaseWatchdog()


def _failed_attempt(ctx: _Ctx, call: Call, tc: ToolCall, t: Tool, error: BaseException) -> Outcome:
    transient = getattr(error, "transient", False) or isinstance(
        error, (TimeoutError, ConnectionError)
    )
    attempt = len(tc.attempts)
    message = f"{type(error).__name__}: {error}"
    tc.attempts[-1]["error"] = message
    tc.error = message
    if isinstance(error, Abandoned):
        tc.attempts[-1].update(abandoned=True, ended=False)  # its end was never seen
        if t.kind in SIDE_EFFECTS and not t.idempotent:
            # It may still land: only an operator can say whether to retry it.
            return _park(
                ctx, tc, WaitReason.IN_DOUBT, ToolCallStatus.IN_DOUBT, "tool_call_in_doubt"
            )
    if transient and attempt < t.retry.max_attempts:
        backoff = t.retry.delay(attempt)
        tc.attempts[-1]["backoff_s"] = backoff
        tc.status = ToolCallStatus.INTENT if t.kind in SIDE_EFFECTS else ToolCallStatus.PLANNED
        return _backoff(ctx, tc, backoff, message)
    tc.status, tc.finished_at = ToolCallStatus.FAILED, timezone.now()
    ctx.pending.append(tc)
    failure = _failure(ctx, error, where="tool", tool=tc.tool, input=tc.args)
    failure["attempts"] = attempt
    return _fail(ctx, failure)


def _backoff(
    ctx: _Ctx,
    tc: ToolCall | None,
    seconds: float,
    message: str,
    *,
    retry_after: float | None = None,
) -> Outcome:
    """Park the run until `seconds` from now; the step is retried then (same decision)."""
    wake = timezone.now() + timedelta(seconds=seconds)
    with transaction.atomic():
        _guarded(
            ctx,
            status=RunStatus.WAITING,
            wait_reason=WaitReason.BACKOFF,
            wake_at=wake,
            lease_owner="",
            lease_expires_at=None,
        )
        _flush_pending(ctx)
        if tc is not None:
            _save_call(tc, ["status", "error", "attempts"])
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


def _park(ctx: _Ctx, tc: ToolCall, reason: str, tc_status: str, event: str) -> Outcome:
    with transaction.atomic():
        _guarded(
            ctx, status=RunStatus.WAITING, wait_reason=reason, lease_owner="", lease_expires_at=None
        )
        _flush_pending(ctx)
        tc.status = tc_status
        _save_call(tc, ["status", "error", "attempts"])
        Step.objects.filter(pk=ctx.step.pk).update(status=StepStatus.WAITING)
        record_event(
            event,
            run=ctx.run,
            step=ctx.step.number,
            payload={"tool": tc.tool, "key": tc.idempotency_key, "args": tc.args},
        )
    return Outcome("waiting", str(ctx.run.pk), ctx.step.number, reason)


# --- commit and failure ------------------------------------------------------------


def _failure(
    ctx: _Ctx,
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
        "message": str(exc),
        "tool": tool,
        "traceback": tb[-8000:],
        "input": input,
    }
    if detail is not None:
        failure["detail"] = detail
    return redact(failure)


def _commit(ctx: _Ctx, decision: Decision, results: list[CallResult]) -> Outcome:
    post_state = ctx.agent.update(ctx.pre_state, decision, results, ctx.sctx)
    finished = decision.final is not None
    return _write_post(
        ctx,
        post_state,
        StepStatus.SUCCEEDED,
        RunStatus.SUCCEEDED if finished else RunStatus.RUNNING,
        final=decision.final,
        decision=decision,
    )


def _fail(ctx: _Ctx, failure: dict[str, Any]) -> Outcome:
    """A step failed for good: post snapshot with the failure, run failed, compensate."""
    post_state = ctx.agent.fail(ctx.pre_state, failure, ctx.sctx)
    outcome = _write_post(ctx, post_state, StepStatus.FAILED, RunStatus.FAILED, failure=failure)
    if outcome.status == "failed":
        compensate_run(Run.objects.get(pk=ctx.run.pk))
    return outcome


def _write_post(
    ctx: _Ctx,
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
        "tokens_in": rawsql.Sql(f"tokens_in + {int(llm.get('tokens_in', 0))}"),
        "tokens_out": rawsql.Sql(f"tokens_out + {int(llm.get('tokens_out', 0))}"),
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
        run_changes.update(lease_owner=ctx.owner, lease_expires_at=_lease_expiry())
    # One guarded write: the compare-and-set on the run, then everything else.
    write = rawsql.Guarded(*_run_update(ctx, run_changes))
    write.insert(Snapshot, rawsql.insert_fields(snap), returning=True)
    new_calls = [tc for tc in ctx.pending if tc.pk is None]
    for tc in ctx.pending:
        if tc.pk is None:
            write.insert(ToolCall, rawsql.insert_fields(tc), returning=True)
        else:
            write.update(ToolCall, tc.pk, {f: getattr(tc, f) for f in _CALL_FIELDS})
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
    _saved(snap, ids[0])
    for tc, pk in zip(new_calls, ids[1 : 1 + len(new_calls)], strict=True):
        _saved(tc, pk)
    ctx.pending.clear()
    if chain:
        _saved(next_step, ids[-2])
        _saved(next_pre, ids[-1])
        ctx.next = _chained(ctx, next_step, next_pre, post_state, node, run_changes)
    elif not terminal:
        enqueue(ctx.run.pk, number + 1)
    _cache_put(str(ctx.run.pk), snap.seq, snap.hash, post_state, node, snap.size)
    status = "failed" if failure else ("finished" if terminal else "committed")
    return Outcome(status, str(ctx.run.pk), number)


def _chained(
    ctx: _Ctx,
    step: Step,
    pre: Snapshot,
    state: dict[str, Any],
    node: hashing.Node,
    run_changes: dict[str, Any],
) -> _Ctx:
    """The context of the step a commit just claimed: the run as that commit left it."""
    run = ctx.run
    run.next_step, run.phase, run.status = step.number, pre.phase, run_changes["status"]
    run.lease_owner, run.lease_expires_at = ctx.owner, run_changes["lease_expires_at"]
    return _Ctx(
        run=run,
        step=step,
        agent=ctx.agent,
        owner=ctx.owner,
        pre_state=state,
        pre=pre,
        pre_node=node,
        chain_until=ctx.chain_until,
    )


def _event(write: rawsql.Guarded, ctx: _Ctx, kind: str, payload: dict[str, Any], now: Any) -> None:
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


# --- compensation ---------------------------------------------------------------------


def compensate_run(run: Run) -> int:
    """Undo the run's successful hybrid calls, newest first. Idempotent; returns how many."""
    done = 0
    pending = ToolCall.objects.filter(run=run, kind="hybrid", status=ToolCallStatus.OK).order_by(
        "-step__number", "-index"
    )
    for tc in pending:
        t = get_tool(tc.tool)
        key = f"{tc.idempotency_key}:compensate"
        tctx = ToolContext(str(run.pk), tc.step.number, tc.index, key)
        try:
            outcome = t.compensate(tctx, tc.args, tc.result) if t.compensate else None
            tc.compensation = {
                "status": "ok",
                "at": timezone.now().isoformat(),
                "key": key,
                "result": redact(outcome),
            }
            tc.status = ToolCallStatus.COMPENSATED
            done += 1
        except Exception as exc:  # recorded; the reconciler tries again
            tc.compensation = {
                "status": "failed",
                "at": timezone.now().isoformat(),
                "key": key,
                "error": f"{type(exc).__name__}: {exc}",
            }
        with transaction.atomic():
            tc.save(update_fields=["status", "compensation"])
            record_event(
                "compensated" if tc.status == ToolCallStatus.COMPENSATED else "compensation_failed",
                run=run,
                step=tc.step.number,
                payload={"tool": tc.tool, "key": tc.idempotency_key, **tc.compensation},
            )
    return done
