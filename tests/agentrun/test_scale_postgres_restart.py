"""Runs in flight survive a PostgreSQL restart.

Fifty runs wait on a slow model when the database server restarts: every
connection in the worker's pool breaks at once. The pool must hand out working
connections again (a step that met a broken one is retried from its pre snapshot
once its lease expires), and every run finishes, each decision stored once.
"""

import os
import shutil
import subprocess
import time

import pytest
from django.db import OperationalError, connection

from tests.agentrun.llm_load import (
    all_finished,
    decision_counts,
    explain,
    llm_env,
    on_postgres,
    spread,
    start_runs,
    statuses,
    turn_of,
)
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, tool_call
from tests.workers import wait_until

RUNS = 50


def _cannot_restart() -> str:
    """Why this machine can't restart the test database's server here, or ''."""
    if not on_postgres():
        return "restarts PostgreSQL: the embedded configuration has none"
    if os.geteuid() != 0:
        return "restarting PostgreSQL needs root"
    if shutil.which("pg_ctlcluster") is None:
        return "restarting PostgreSQL needs pg_ctlcluster (Debian's postgresql-common)"
    return ""


_why = _cannot_restart()
# CI has root and pg_ctlcluster: there this test runs on PostgreSQL or fails.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.postgres,
    pytest.mark.skipif(
        bool(_why) and not (on_postgres() and os.environ.get("CI") == "true"), reason=_why
    ),
]


def cluster_of_test_database() -> tuple[str, str]:
    """(version, name) of the local cluster listening on the test database's port."""
    port = connection.settings_dict["PORT"] or "5432"
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout
    for line in listing.splitlines():
        version, name, cluster_port = line.split()[:3]
        if cluster_port == port:
            return version, name
    raise AssertionError(f"no local cluster on port {port}:\n{listing}")


def reconnect(timeout: float = 60) -> None:
    """This process's own connection, through the restart: drop the broken ones."""
    deadline = time.monotonic() + timeout
    while True:
        connection.close()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return
        except OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def server_start_time() -> object:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_postmaster_start_time()")
        return cursor.fetchone()[0]


def slow_model(request: Recorded) -> Reply:
    """Echo twice, then answer; each reply after 0.5-2 s."""
    turn = turn_of(request)
    if turn < 2:
        body = completion(tool_calls=[tool_call("echo", {"turn": turn}, id=f"call_{turn}")])
    else:
        body = completion("echoed twice")
    return Reply(200, body, delay=spread(request, 0.5, 2.0))


def test_runs_in_flight_finish_after_postgresql_restarts(start_worker):
    assert not _why, _why  # only CI gets here without root or pg_ctlcluster
    version, cluster = cluster_of_test_database()
    with FakeOpenAI(respond=slow_model) as fake:
        runs = start_runs(RUNS, tools=["echo"])
        worker = start_worker(beat=True, **llm_env(fake))
        # Restart with every run in flight: most waiting on the model, a few writing.
        wait_until(
            lambda: fake.in_flight >= RUNS * 3 // 4 and len(fake.chat_requests()) > RUNS,
            timeout=60,
            interval=0.05,
            what="the runs to be in flight past their first step",
        )
        started = server_start_time()
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart"],
            check=True,
            timeout=120,
        )
        reconnect()
        assert server_start_time() > started, "the server did not restart"
        try:
            wait_until(all_finished(runs), timeout=120, interval=0.5, what="every run to finish")
        except TimeoutError:
            print(explain(runs, worker))
            raise

    assert statuses(runs) == {"succeeded": RUNS}, explain(runs, worker)
    assert decision_counts(runs) == {1: 3 * RUNS}
