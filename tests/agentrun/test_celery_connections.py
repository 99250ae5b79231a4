"""A worker keeps its database connection from one step to the next.

Celery's Django fixup would close it around every task; agentrun.celery closes it
only when Django would close a request's: broken, or older than CONN_MAX_AGE.
"""

from typing import Any

import pytest
from django.db import connection

from agentrun.models import ToolCall
from agentrun.tools import ToolContext, tool
from tests.base import calls, final, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


# The worker loads this module (AGENTRUN_AGENT_MODULES). timeout=0 runs the tool in
# the step's own thread, so it sees the engine's connection.
@tool(name="database_session", timeout=0, cache=False)
def database_session(ctx: ToolContext, n: int) -> int:
    """The PostgreSQL backend (session) serving this step."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite connects per task")
def test_a_worker_serves_consecutive_steps_from_one_database_session(start_worker):
    steps = [calls({"tool": "database_session", "args": {"n": n}}) for n in range(5)]
    run = make_run(script(*steps, final()))
    start_worker(AGENTRUN_AGENT_MODULES=__name__, AGENTRUN_CHAIN_SECONDS="0")  # a task a step

    def finished() -> Any:
        run.refresh_from_db()
        return run.status in ("succeeded", "failed")

    wait_until(finished, timeout=60, what="the run to finish")
    assert run.status == "succeeded", run.error
    sessions = list(
        ToolCall.objects.filter(run=run, tool="database_session")
        .order_by("step__number")
        .values_list("result", flat=True)
    )
    assert len(sessions) == 5
    assert len(set(sessions)) == 1, sessions
