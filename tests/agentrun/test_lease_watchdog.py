"""One watchdog per process keeps the leases of every waiting step, but not forever."""

import threading
import time

import pytest
from django.db import close_old_connections
from django.utils import timezone

from agentrun import engine
from agentrun.models import Run
from agentrun.tools import ToolContext, tool
from tests.base import calls, final, make_run, script

# Committed for real: the steps run in threads, on their own connections.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durability]


@tool(name="test_wait", timeout=0, cache=False)
def wait(ctx: ToolContext, seconds: float) -> dict:
    time.sleep(seconds)
    return {"waited": seconds}


def _in_threads(runs: list[Run]) -> list[threading.Thread]:
    def step(run: Run) -> None:
        try:
            engine.execute_step(run.pk, 1)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=step, args=(run,)) for run in runs]
    for t in threads:
        t.start()
    return threads


def _leased(runs: list[Run]) -> int:
    return Run.objects.filter(
        pk__in=[r.pk for r in runs], lease_owner__gt="", lease_expires_at__gt=timezone.now()
    ).count()


def test_one_watchdog_keeps_the_leases_of_many_waiting_steps(settings):
    settings.AGENTRUN_LEASE_SECONDS = 1.5
    runs = [
        make_run(script(calls({"tool": "test_wait", "args": {"seconds": 4.5 + i / 100}}), final()))
        for i in range(12)
    ]
    threads = _in_threads(runs)
    time.sleep(3.5)  # far past the 1.5 s lease each step took at its claim
    assert _leased(runs) == 12
    watchdogs = [t for t in threading.enumerate() if t.name == "agentrun-lease"]
    assert len(watchdogs) == 1
    for t in threads:
        t.join(timeout=20)
    statuses = Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("next_step", flat=True)
    assert set(statuses) == {2}  # every step committed under its renewed lease


def test_a_step_waiting_past_the_step_time_limit_loses_its_lease(settings):
    settings.AGENTRUN_LEASE_SECONDS = 1.5
    settings.AGENTRUN_STEP_TIME_LIMIT = 3
    run = make_run(script(calls({"tool": "test_wait", "args": {"seconds": 9}}), final()))
    (thread,) = _in_threads([run])
    time.sleep(2.5)
    assert _leased([run]) == 1  # renewed while within the limit
    time.sleep(4.5)  # the limit, a lease and a beat later
    assert _leased([run]) == 0  # given up: another worker may take the step over
    assert engine.claim(str(run.pk), 1, "another-worker") is not None  # taken over
    thread.join(timeout=20)
    run.refresh_from_db()
    # The hung step's late commit was refused: the step is the new owner's to do.
    assert (run.next_step, run.lease_owner) == (1, "another-worker")
