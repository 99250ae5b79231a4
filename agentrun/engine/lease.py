"""Leases: who owns a step, guarded writes, and the watchdog that renews them."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils import timezone

from agentrun.engine.context import Claimed, LeaseLost
from agentrun.models import (
    Run,
    RunStatus,
)
from agentrun.store import rawsql

log = logging.getLogger(__name__)


def new_lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# Leases run on the database's clock on PostgreSQL: a lease taken or renewed ends
# AGENTRUN_LEASE_SECONDS after the statement that wrote it, by the server's time, and a
# claim compares with the server's time too; a worker's clock (minutes off, say) decides
# nothing. (Embedded, SQLite lives on the workers' own host: one clock.)
DB_NOW = "statement_timestamp()"
DB_LEASE_END = "statement_timestamp() + %s * interval '1 second'"


def lease_expiry() -> Any:
    """When a lease taken now ends, by this worker's clock: an estimate, for this process's
    own use (the run row's value is the database's: lease_end)."""
    return timezone.now() + timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS)


def lease_end() -> Any:
    """The end of a lease taken or renewed now, as a value for the run's `lease_expires_at`
    in a guarded write (rawsql): by the database's clock on PostgreSQL."""
    if connection.vendor == "postgresql":
        return rawsql.Sql(DB_LEASE_END, (float(settings.AGENTRUN_LEASE_SECONDS),))
    return lease_expiry()


def _orm_lease_end() -> Any:
    """lease_end for a QuerySet.update()."""
    if connection.vendor == "postgresql":
        lease = Value(timedelta(seconds=settings.AGENTRUN_LEASE_SECONDS))
        return ExpressionWrapper(Now() + lease, output_field=DateTimeField())
    return lease_expiry()


def guarded_update(ctx: Claimed, **changes: Any) -> None:
    """Extend our lease (and apply changes) only if we still hold it. In a transaction."""
    n = Run.objects.filter(
        pk=ctx.run.pk, next_step=ctx.step.number, lease_owner=ctx.owner, status=RunStatus.RUNNING
    ).update(**{"lease_expires_at": _orm_lease_end(), "updated_at": timezone.now(), **changes})
    if n != 1:
        raise LeaseLost(f"run {ctx.run.pk} step {ctx.step.number}")


def lease_guard(ctx: Claimed, now: Any, **changes: Any) -> rawsql.Guarded:
    """A guarded write that extends our lease (and applies `changes` to the run)."""
    sql, params = run_update(
        ctx,
        {
            "lease_expires_at": lease_end(),
            "updated_at": now,
            **changes,
        },
    )
    return rawsql.Guarded(sql, params)


def run_update(ctx: Claimed, changes: dict[str, Any]) -> tuple[str, list[Any]]:
    """`UPDATE run SET changes` if we still hold the lease on this step."""
    params: list[Any] = []
    for name, value in changes.items():
        if isinstance(value, rawsql.Sql):
            params += value.params
        else:
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


class _LeaseWatchdog:
    """One thread per process that renews the leases of the steps waiting on a model
    or a tool, all of them in one statement per beat, however many are in flight.

    Not forever: a wait longer than AGENTRUN_STEP_TIME_LIMIT (a policy or tool that
    hangs) stops being renewed, so its lease expires and another worker takes the
    step over; the hung thread's own writes are then refused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key: [ctx, next renewal, give up after] (time.monotonic())
        self._steps: dict[int, list[Any]] = {}
        self._keys = iter(range(1, 1 << 62))
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, ctx: Claimed) -> Iterator[None]:
        with self._lock:
            # First use, a forked child (threads don't fork), or a thread that died.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="agentrun-lease", daemon=True
                )
                self._thread.start()
            key = next(self._keys)
            now = time.monotonic()
            self._steps[key] = [ctx, now + _beat(), now + settings.AGENTRUN_STEP_TIME_LIMIT]
        try:
            yield
        finally:
            with self._lock:
                self._steps.pop(key, None)

    def _run(self) -> None:
        while True:
            try:
                self._beat_once()
            except Exception:  # never let the one renewing thread die
                log.exception("lease watchdog")

    def _beat_once(self) -> None:
        # At most a second: a lease setting that changes (tests) is seen at once.
        time.sleep(min(_beat() / 2, 1.0))
        now = time.monotonic()
        with self._lock:
            due = [entry for entry in self._steps.values() if entry[1] <= now]
            for entry in due:
                entry[1] = now + _beat() if now < entry[2] else float("inf")
        hung = [entry[0] for entry in due if entry[1] == float("inf")]
        for ctx in hung:
            log.error(
                "step %s of %s has waited longer than AGENTRUN_STEP_TIME_LIMIT (%ss):"
                " its lease is no longer renewed, another worker will take it over",
                ctx.step.number,
                ctx.run.pk,
                settings.AGENTRUN_STEP_TIME_LIMIT,
            )
        due = [entry for entry in due if entry[1] != float("inf")]
        if not due:
            return
        try:
            _renew([entry[0] for entry in due])
        except Exception:  # logged; each step's next guarded write decides
            log.exception("lease renewal of %d steps", len(due))
        finally:
            close_old_connections()  # back to the pool between beats


def _beat() -> float:
    return max(settings.AGENTRUN_LEASE_SECONDS / 3, 0.05)


def _renew(steps: list[Claimed]) -> None:
    """Extend the leases of these steps, in batches of one UPDATE each.

    A lease owner names one claim (host, pid and a random part), so the owner and
    the running status are enough to find the step's run row: a run whose lease
    was taken over or that was cancelled is left alone, and that step's next
    guarded write stops it.
    """
    for i in range(0, len(steps), 500):
        batch = steps[i : i + 500]
        owners = {ctx.owner for ctx in batch}
        if getattr(connection, "pool", None) is not None:
            n = _renew_on_own_connection(owners)
        else:
            n = Run.objects.filter(lease_owner__in=owners, status=RunStatus.RUNNING).update(
                lease_expires_at=_orm_lease_end()
            )
        if n < len(owners):
            log.warning(
                "lease renewal: %d of %d steps have lost their lease", len(owners) - n, len(owners)
            )


# The watchdog's own connection, outside the pool: steps and their tools may hold every
# pooled connection (a tool that used the ORM keeps its thread's one while it waits on
# something else), and leases must not wait behind them. Used by the watchdog thread only.
_OWN: list[Any] = []


def _renew_on_own_connection(owners: set[str]) -> int:
    import psycopg

    try:
        if not _OWN or _OWN[0].closed:
            params = connection.get_connection_params()  # the pool's, without the pool
            params.pop("cursor_factory", None)
            _OWN[:] = [psycopg.connect(**params, autocommit=True)]
        cursor = _OWN[0].execute(
            f"UPDATE {rawsql.table(Run)} SET lease_expires_at = {DB_LEASE_END}"
            " WHERE lease_owner = ANY(%s) AND status = 'running'",
            [float(settings.AGENTRUN_LEASE_SECONDS), list(owners)],
        )
        return cursor.rowcount
    except psycopg.Error:
        if _OWN:
            _OWN.pop().close()  # a new one at the next beat (e.g. after a database restart)
        raise


WATCHDOG = _LeaseWatchdog()
