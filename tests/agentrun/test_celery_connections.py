"""A worker's steps share a bounded pool of PostgreSQL connections.

A step hands its connection back while it waits on a model or a tool, so many
steps in flight in one process hold no more connections than DB_POOL_MAX_SIZE,
and consecutive steps reuse pooled sessions instead of connecting again.
"""

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

from agentrun.models import Run, ToolCall
from agentrun.tools import ToolContext, tool
from tests.base import calls, final, make_run, script
from tests.workers import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite has no pool"),
]


# The worker loads this module (AGENTRUN_AGENT_MODULES). timeout=0 runs the tool in
# the step's own thread, so it sees the engine's connection.
@tool(name="database_session", timeout=0, cache=False)
def database_session(ctx: ToolContext, n: int) -> int:
    """The PostgreSQL backend (session) serving this step."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _finished(*runs: Run) -> Any:
    def check() -> bool:
        return not Run.objects.filter(
            pk__in=[r.pk for r in runs], status__in=("queued", "running")
        ).exists()

    return check


def test_consecutive_steps_reuse_pooled_sessions(start_worker):
    steps = [calls({"tool": "database_session", "args": {"n": n}}) for n in range(6)]
    run = make_run(script(*steps, final()))
    start_worker(
        AGENTRUN_AGENT_MODULES=__name__, AGENTRUN_CHAIN_SECONDS="0", DB_POOL_MAX_SIZE="2"
    )  # a task a step
    wait_until(_finished(run), timeout=60, what="the run to finish")
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    sessions = list(
        ToolCall.objects.filter(run=run, tool="database_session").values_list("result", flat=True)
    )
    assert len(sessions) == 6
    assert len(set(sessions)) <= 2, sessions  # never more than the pool, never one per step


class _ConnectionWatcher(threading.Thread):
    """Polls pg_stat_activity for the sessions of one application name; keeps the peak."""

    def __init__(self, application_name: str) -> None:
        super().__init__(daemon=True)
        self.name_ = application_name
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        conn = connections.create_connection("default")
        try:
            while not self.stop.is_set():
                with conn.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        [self.name_],
                    )
                    self.peak = max(self.peak, cursor.fetchone()[0])
                time.sleep(0.05)
        finally:
            conn.close()


def test_sixty_steps_waiting_on_tools_hold_no_more_connections_than_the_pool(start_worker):
    runs = [
        make_run(script(calls({"tool": "sleep", "args": {"seconds": 2.5 + i / 1000}}), final()))
        for i in range(60)
    ]
    watcher = _ConnectionWatcher("agentrun-pool-test")
    watcher.start()
    start_worker(PGAPPNAME="agentrun-pool-test", DB_POOL_MAX_SIZE="4")
    try:
        # All sixty are in flight at once: each holds its lease while its tool sleeps.
        wait_until(
            lambda: (
                ToolCall.objects.filter(run__in=runs, tool="sleep").count() == 0
                and Run.objects.filter(pk__in=[r.pk for r in runs], lease_owner__gt="").count()
                == 60
            ),
            timeout=30,
            interval=0.05,
            what="sixty steps in flight",
        )
        wait_until(_finished(*runs), timeout=90, what="the runs to finish")
    finally:
        watcher.stop.set()
        watcher.join(timeout=5)
    assert set(
        Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)
    ) == {"succeeded"}
    assert 1 <= watcher.peak <= 4, watcher.peak
