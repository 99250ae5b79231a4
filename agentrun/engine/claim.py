"""Phase 1: claim a step with a lease and make sure its pre snapshot exists."""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentrun.agents import Agent, InvalidInput, get_agent
from agentrun.engine.cache import cache_get, cache_put
from agentrun.engine.context import Claimed
from agentrun.engine.lease import DB_LEASE_END, DB_NOW
from agentrun.engine.versions import code_version
from agentrun.models import (
    Run,
    Snapshot,
    Step,
)
from agentrun.store import hashing, rawsql, snapshots

log = logging.getLogger(__name__)

LOST = "the attempt ended without an outcome: its worker died or lost its lease"


class UnknownAgent(Exception):
    """The claimed run's agent is not registered in this worker."""

    def __init__(self, run: Run, number: int, owner: str, message: str) -> None:
        super().__init__(message)
        self.run, self.number, self.owner = run, number, owner


def claim(run_id: str, number: int, owner: str) -> Claimed | None:
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
    try:
        agent = get_agent(run.agent)
    except InvalidInput as exc:
        raise UnknownAgent(run, number, owner, str(exc)) from None
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
    return Claimed(
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
    " AND wait_reason = 'backoff')) AND (lease_expires_at IS NULL OR lease_expires_at < {now})"
    " AND (wake_at IS NULL OR wake_at <= %s)"
    # An imported run (agentrun.lifecycle.archive) is read-only: no worker ever claims it.
    " AND imported_at IS NULL"
    # A run that asks for a code version is claimed by a worker of that version only.
    " AND (target_version = '' OR target_version = %s)"
)


def _claim_set(run_id: str, number: int, owner: str, now: Any) -> tuple[str, list[Any]]:
    """The claim as `UPDATE run SET ... WHERE <due>` and its parameters.

    On PostgreSQL whether a lease has expired, and when the new one does, are the
    database's clock's say (lease.DB_LEASE_END), never this worker's."""
    version = code_version()
    on_pg = connection.vendor == "postgresql"
    lease = float(settings.AGENTRUN_LEASE_SECONDS)
    params = [
        owner,
        version,
        lease if on_pg else rawsql.prep(Run, "lease_expires_at", now + timedelta(seconds=lease)),
        rawsql.prep(Run, "started_at", now),
        rawsql.prep(Run, "updated_at", now),
        rawsql.prep(Run, "id", run_id),
        number,
        *([] if on_pg else [rawsql.prep(Run, "lease_expires_at", now)]),
        rawsql.prep(Run, "wake_at", now),
        version,
    ]
    return _claim_sql(on_pg), params


@cache
def _claim_sql(on_pg: bool) -> str:
    until, now = (DB_LEASE_END, DB_NOW) if on_pg else ("%s", "%s")
    return (
        f"UPDATE {rawsql.table(Run)} SET status = 'running', wait_reason = '', wake_at = NULL,"
        f" lease_owner = %s, code_version = %s, lease_expires_at = {until},"
        " started_at = COALESCE(started_at, %s),"
        f" updated_at = %s WHERE id = %s AND {_DUE.format(now=now)}"
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
    data = rawsql.column(Snapshot, "data")
    existing = ", ".join(
        f"CASE WHEN %s THEN e.{data} END" if n == "data" else "e." + rawsql.column(Snapshot, n)
        for n in rawsql.attnames(Snapshot)
    )
    snap_t, step_t = rawsql.table(Snapshot), rawsql.table(Step)
    statement = (
        f"WITH {rawsql.ASYNC_COMMIT}, r AS ({_claim_sql(True)} RETURNING {rawsql.select_list(Run)}), "
        f"s AS (INSERT INTO {step_t} (run_id, number, status, attempts, crashes, crash_log,"
        " worker, code_version, phase_before, phase_after, decision_count, tokens_in,"
        " tokens_out, started_at)"
        " SELECT r.id, %s::integer, 'running', 1, 0, '[]'::jsonb, r.lease_owner,"
        " r.code_version, COALESCE((SELECT"
        f" phase FROM {snap_t} WHERE run_id = r.id AND seq <= %s::integer ORDER BY seq DESC"
        " LIMIT 1), ''), '', 0, 0, 0, %s::timestamptz FROM r"
        f" ON CONFLICT (run_id, number) DO UPDATE SET {_RECLAIM_PG}"
        f" RETURNING {rawsql.select_list(Step)}), "
        f"p AS (INSERT INTO {snap_t} ({insert_cols}) SELECT {insert_vals} FROM r,"
        f" LATERAL (SELECT * FROM {snap_t} WHERE run_id = r.id AND seq < %s::integer"
        " ORDER BY seq DESC LIMIT 1) l"
        f" ON CONFLICT (run_id, seq) DO NOTHING RETURNING {returning}), "
        # The pre snapshot as it was, when it exists already (the run's first, written
        # with the run; a retried step's): with its data for a first step, whose
        # state this worker has not cached (a retried step's state it may have).
        f"e AS (SELECT {existing} FROM {snap_t} e"
        " WHERE e.run_id = (SELECT id FROM r) AND e.seq = %s::integer) "
        "SELECT r.*, s.*, p.*, e.* FROM cfg CROSS JOIN r CROSS JOIN s LEFT JOIN p ON true"
        " LEFT JOIN e ON true"
    )
    return statement, snap_names


def _claim_pg(
    run_id: str, number: int, owner: str, now: Any
) -> tuple[Run, Step, Snapshot | None] | None:
    """The claim in one statement: lease, step row (or one more attempt), pre snapshot.

    The pre snapshot is written as a REF to the latest snapshot before it when
    there is one and the pre doesn't exist yet; one that exists is returned as it
    is (a first step's with its data); otherwise (a fork's first step, a run
    written without its first pre snapshot) the caller builds it.
    Commits asynchronously: a claim lost in a database crash costs nothing,
    and every later synchronous commit flushes it.
    """
    sql, params = _claim_set(run_id, number, owner, now)
    seq = Snapshot.seq_for(number, "pre")
    params += [
        number,
        seq,  # phase_before: the phase of the latest snapshot at or before the pre
        rawsql.prep(Step, "started_at", now),
        LOST,
        number,
        seq,
        rawsql.prep(Snapshot, "created_at", now),
        seq,
        number == 1,
        seq,
    ]
    statement, snap_names = _claim_pg_sql()
    step_names, run_names = rawsql.attnames(Step), rawsql.attnames(Run)
    row = rawsql.run_statement(statement, params)
    if row is None:
        log.debug("step %s of %s is not claimable now", number, run_id)
        return None
    a, b = len(run_names), len(run_names) + len(step_names)
    c = b + len(snap_names)
    run = rawsql.from_row(Run, run_names, row[:a])
    step = rawsql.from_row(Step, step_names, row[a:b])
    pre = None
    if row[b] is not None:
        pre = rawsql.from_row(Snapshot, snap_names, row[b:c])
    elif row[c] is not None:
        names = rawsql.attnames(Snapshot)
        if number == 1:
            pre = rawsql.from_row(Snapshot, names, row[c:])
        else:  # without its data: a keyframe's is read when this worker has no cached state
            data = names.index("data")
            pre = rawsql.from_row(Snapshot, snap_names, row[c:][:data] + row[c:][data + 1 :])
    return run, step, pre


# Another attempt at a step. One whose last attempt is still 'running' ended without an
# outcome (every way an attempt ends sets another status): it crashed, and counts.
_RECLAIM_PG = (
    "attempts = agentrun_step.attempts + (agentrun_step.status <> 'resuming')::integer,"
    " status = 'running', worker = EXCLUDED.worker,"
    " code_version = EXCLUDED.code_version,"
    " crashes = agentrun_step.crashes + (agentrun_step.status = 'running')::integer,"
    " crash_log = CASE WHEN agentrun_step.status = 'running' THEN agentrun_step.crash_log"
    " || jsonb_build_array(jsonb_build_object('worker', agentrun_step.worker, 'error',"
    " %s::text, 'noticed_at', EXCLUDED.started_at)) ELSE agentrun_step.crash_log END"
)

_STEP_UPSERT = """
INSERT INTO agentrun_step (run_id, number, status, attempts, crashes, crash_log, worker,
    code_version, phase_before, phase_after, decision_count, tokens_in, tokens_out, started_at)
VALUES (%s, %s, 'running', 1, 0, '[]', %s, %s, %s, '', 0, 0, 0, %s)
ON CONFLICT (run_id, number) DO UPDATE SET
    attempts = agentrun_step.attempts + (agentrun_step.status <> 'resuming'),
    status = 'running', worker = excluded.worker, code_version = excluded.code_version,
    crashes = agentrun_step.crashes + (agentrun_step.status = 'running'),
    crash_log = CASE WHEN agentrun_step.status = 'running' THEN json_insert(
        agentrun_step.crash_log, '$[#]', json_object('worker', agentrun_step.worker,
        'error', %s, 'noticed_at', excluded.started_at)) ELSE agentrun_step.crash_log END
RETURNING *
"""


def _upsert_step(run: Run, number: int, phase_before: str, now: Any) -> Step:
    """Create the step, or count one more attempt at it: one statement."""
    run_id = run.pk.hex if connection.vendor == "sqlite" else run.pk
    params = [run_id, number, run.lease_owner, run.code_version, phase_before, now, LOST]
    return list(Step.objects.raw(_STEP_UPSERT, params))[0]


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
    cache_put(str(run.pk), snap.seq, snap.hash, state, node, snap.size)
    return snap, state, node


def _state_of(run_id: str, snap: Snapshot) -> tuple[dict[str, Any], hashing.Node]:
    """A snapshot's state and hash tree: from this worker's cache, else rebuilt from the store."""
    cached = cache_get(run_id, snap.hash)
    if cached is not None:
        return cached
    state = snapshots.load_state(snap)
    node = hashing.build(state)
    cache_put(run_id, snap.seq, snap.hash, state, node, snap.size)
    return state, node
