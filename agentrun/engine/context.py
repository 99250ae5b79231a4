"""What every phase of a step shares: its context, its outcome, and small helpers."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from agentrun.agents import Agent, Call, CallResult, Decision, StepContext
from agentrun.models import (
    Run,
    RunStatus,
    Snapshot,
    Step,
    ToolCall,
    ToolCallStatus,
)
from agentrun.store import hashing

log = logging.getLogger(__name__)


CLAIMABLE = (RunStatus.QUEUED, RunStatus.RUNNING)


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


@dataclass
class Claimed:
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
    next: Claimed | None = None  # the next step, claimed by this one's commit
    # For telemetry: the decision this attempt acted on, its calls (each with its call id
    # and the attempts it had before this step attempt), when its model was asked (wall
    # clock, ns) and the failure it ended with.
    decision: Decision | None = None
    acted: list[tuple[ToolCall, str | None, int]] = field(default_factory=list)
    llm_window: tuple[int, int] | None = None
    failure: dict[str, Any] | None = None

    @property
    def sctx(self) -> StepContext:
        return StepContext(str(self.run.pk), self.step.number, self.run.input, self.run.first_step)


CALL_FIELDS = ["status", "result", "error", "attempts", "finished_at", "from_cache"]


def save_call(tc: ToolCall, fields: list[str]) -> None:
    """Save these fields of a call; a read call not yet on record is inserted whole."""
    if tc.pk is None:
        tc.save()
    else:
        tc.save(update_fields=fields)


def flush_pending(ctx: Claimed) -> None:
    for tc in ctx.pending:
        save_call(tc, CALL_FIELDS)
    ctx.pending.clear()


def release_connection() -> None:
    """Hand this thread's database connection back before a wait that may be long.

    With a pool (PostgreSQL, DB_POOL_MAX_SIZE > 0) a step does this before every call to
    a model or a tool, and takes a connection again for its next write, so connections
    per process stay at the pool's size however many steps are in flight. Without a
    pool (SQLite), or inside a transaction, the connection stays.
    """
    conn = connections[DEFAULT_DB_ALIAS]  # (not the proxy, django.db.connection: a hot path)
    if getattr(conn, "pool", None) is not None and not conn.in_atomic_block:
        conn.close()


def mark_saved(obj: Any, pk: Any) -> None:
    """Mark an object inserted with raw SQL as saved, with its new primary key."""
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = DEFAULT_DB_ALIAS  # the engine's one connection


DONE = (ToolCallStatus.OK, ToolCallStatus.SKIPPED, ToolCallStatus.COMPENSATED)


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


def result_of(tc: ToolCall, call: Call) -> CallResult:
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
