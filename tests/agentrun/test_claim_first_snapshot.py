"""A run's first claim on PostgreSQL finds the first pre snapshot (written with the run) in
its one statement, data included: a worker that did not create the run reads nothing else."""

from __future__ import annotations

import pytest
from django.db import connection

from agentrun import engine
from agentrun.engine import cache
from agentrun.engine.lease import new_lease_owner
from agentrun.models import Run
from agentrun.store import snapshots
from tests.base import make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durability]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement claim is PostgreSQL's")


def test_a_first_claim_brings_the_first_snapshot_and_its_state_in_one_statement():
    run = make_run()
    cache._CACHE.clear()  # as in a worker that did not create the run

    statements: list[str] = []

    def log(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(log):
        ctx = engine.claim(str(run.pk), 1, new_lease_owner())

    assert len(statements) == 1, [s[:80] for s in statements]
    assert ctx is not None
    stored = snapshots.get(run.pk, 1, "pre")
    assert (ctx.pre.pk, ctx.pre.seq, ctx.pre.hash) == (stored.pk, stored.seq, stored.hash)
    assert ctx.pre_state == snapshots.load_state(stored)
    assert ctx.step.phase_before == stored.phase


def test_a_retried_first_step_finds_the_same_snapshot_without_its_data():
    run = make_run()
    first = engine.claim(str(run.pk), 1, new_lease_owner())
    assert first is not None
    Run.objects.filter(pk=run.pk).update(lease_expires_at=None)  # the lease is let go

    again = engine.claim(str(run.pk), 1, new_lease_owner())

    assert again is not None
    assert again.pre.pk == first.pre.pk
    assert again.step.attempts == 2 and again.step.crashes == 1
    assert again.pre_state == first.pre_state
