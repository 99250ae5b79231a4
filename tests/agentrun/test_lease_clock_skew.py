"""Leases don't depend on the workers' clocks: a worker whose clock is minutes off neither
takes over a step another worker holds, nor takes a lease others can take from it at once.

On PostgreSQL a lease's end is written, and compared, by the database's clock. A worker
with a skewed clock is played here by this process with Django's clock (timezone.now,
what the engine reads) moved ten minutes ahead or behind.
"""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone

from agentrun import engine
from agentrun.engine import lease
from agentrun.engine.lease import new_lease_owner
from agentrun.models import Run
from tests.base import calls, final, make_run, script

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.durability,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="embedded, SQLite and every worker share one host and its clock",
    ),
]

SKEW = timedelta(minutes=10)


def skewed_clock(by: timedelta):
    """This process's clock (as the engine reads it) moved by `by`."""
    real = timezone.now
    return mock.patch("django.utils.timezone.now", lambda: real() + by)


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def lease_left(run: Run) -> float:
    """Seconds until the run's lease ends, by the database's clock."""
    run.refresh_from_db()
    return (run.lease_expires_at - database_now()).total_seconds()


def test_a_worker_whose_clock_runs_ahead_does_not_take_over_a_held_step(settings):
    settings.AGENTRUN_LEASE_SECONDS = 30.0
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    holder = engine.claim(str(run.pk), 1, new_lease_owner())
    assert holder is not None

    with skewed_clock(SKEW):  # to this worker, the holder's lease ended minutes ago
        assert engine.claim(str(run.pk), 1, new_lease_owner()) is None
    run.refresh_from_db()
    assert run.lease_owner == holder.owner


def test_a_worker_whose_clock_runs_behind_takes_a_lease_that_lasts_by_the_databases_clock(
    settings,
):
    settings.AGENTRUN_LEASE_SECONDS = 30.0
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    with skewed_clock(-SKEW):
        late = engine.claim(str(run.pk), 1, new_lease_owner())
    assert late is not None
    # Its lease ends 30 s from now by the database's clock, not ten minutes ago.
    assert 25 <= lease_left(run) <= 31
    # So a worker with a right clock does not take the step from it.
    assert engine.claim(str(run.pk), 1, new_lease_owner()) is None
    run.refresh_from_db()
    assert run.lease_owner == late.owner


def test_a_skewed_workers_watchdog_renews_leases_by_the_databases_clock(settings):
    settings.AGENTRUN_LEASE_SECONDS = 30.0
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    with skewed_clock(-SKEW):
        ctx = engine.claim(str(run.pk), 1, new_lease_owner())
        assert ctx is not None
        Run.objects.filter(pk=run.pk).update(lease_expires_at=database_now())  # nearly over
        lease._renew([ctx])  # what the watchdog does every lease/3 while the step waits
    assert 25 <= lease_left(run) <= 31


def test_a_skewed_worker_commits_its_step_and_keeps_its_lease_by_the_databases_clock(settings):
    settings.AGENTRUN_LEASE_SECONDS = 30.0
    run = make_run(
        script(calls({"tool": "echo", "args": {"n": 1}}), calls({"tool": "echo"}), final())
    )
    seen: list[float] = []

    def observe(outcome) -> None:
        if outcome.status == "committed":  # the commit claimed the next step: a new lease
            seen.append(lease_left(Run.objects.get(pk=run.pk)))

    with skewed_clock(-SKEW):
        engine.execute_step(run.pk, 1, chain=60, observe=observe)
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert seen and all(25 <= left <= 31 for left in seen), seen
