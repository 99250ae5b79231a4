"""A tool that used the database, then waits, must not cost its step the lease.

A tool thread takes a pooled connection the first time its tool uses the ORM and
keeps it until the call ends. Tools that query and then wait on something slow
(an HTTP API) can hold every connection of the pool, and the lease watchdog,
which renews through the same pool, waits behind them: the leases expire, another
worker takes the steps over and their tools run again.

Found by the scale tests: the watchdog now renews on a connection of its
own, outside the pool.
"""

import time

import pytest
from django.db import connection

from agentrun.models import Run, Step
from agentrun.tools import ToolContext, tool
from tests.base import calls, final, make_run, script
from tests.workers import decided, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no pool"),
    pytest.mark.durability,
]

POOL = 2  # connections per worker process, and tools waiting at once
WAIT = 20.0  # seconds each tool waits: several leases, and time for a second worker to start


# The worker loads this module (AGENTRUN_AGENT_MODULES).
@tool(cache=False)
def look_up_then_wait(ctx: ToolContext, seconds: float) -> int:
    """Count the runs, then wait on something slow that is not the database."""
    runs = Run.objects.count()
    time.sleep(seconds)
    return runs


def test_tools_that_used_the_database_keep_their_leases_while_they_wait(start_worker):
    runs = [
        make_run(script(calls({"tool": "look_up_then_wait", "args": {"seconds": WAIT}}), final()))
        for _ in range(POOL)
    ]
    # POOL pooled connections, and the lease watchdog's own.
    env = {"AGENTRUN_AGENT_MODULES": __name__, "DB_POOL_MAX_SIZE": str(POOL + 1)}
    # As many steps as the worker runs at once (it takes no more messages meanwhile),
    # as many tools holding a connection as its pool has.
    start_worker(concurrency=POOL, **env)
    for run in runs:
        wait_until(decided(run, 1), what="the tools to start")
    # A second worker, whose reconciler would take over any step whose lease expired.
    start_worker(beat=True, **env)
    ids = [r.pk for r in runs]
    steps = Step.objects.filter(run__in=runs, number=1)
    wait_until(
        lambda: (
            steps.filter(attempts__gt=1).exists()
            or not Run.objects.filter(pk__in=ids, status__in=("queued", "running")).exists()
        ),
        timeout=90,
        what="the runs to finish, or a step to be taken over",
    )
    # Each step was claimed once, so its tool ran once: no lease ran out.
    assert sorted(steps.values_list("attempts", flat=True)) == [1] * POOL
    assert set(Run.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"succeeded"}
