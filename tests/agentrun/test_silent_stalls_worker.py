"""No silent stalls, through a real worker.

An agent's bug that leaves a state its own schema refuses fails the step that
produced it, with the path, on the run (page and API), not only in a worker's log;
a worker that doesn't know a run's agent parks it with the fix to make; and
`startrun --wait` says why a run is not moving.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from agentrun.agents import Decision, StateAgent, register
from agentrun.lifecycle import services
from agentrun.models import Run, Step
from tests.base import make_people
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


# The worker loads this module (AGENTRUN_AGENT_MODULES) in the tests that say so.
@register
class NoteTaker(StateAgent):
    """Finding 11's agent: its observe hook writes a dict where notes are strings."""

    name = "note_taker"

    def decide(self, state, ctx):
        if ctx.step == 1:
            return Decision(thought="look it up", rationale="need the weather")
        return Decision(thought="answer", final="sunny")

    def observe(self, st, decision, results, ctx):
        st.memory["notes"]["weather"] = {"sky": "sunny"}  # the bug: notes are strings


def stopped(run: Run):
    def check() -> bool:
        run.refresh_from_db()
        return run.status not in ("queued", "running")

    return check


def test_a_state_the_agents_schema_refuses_fails_the_step_that_produced_it(start_worker):
    run = services.start_run("note_taker", {"goal": "weather in Oslo"})
    worker = start_worker(AGENTRUN_AGENT_MODULES=__name__)
    wait_until(stopped(run), timeout=60, interval=0.2, what="the run to stop")

    assert run.status == "failed", worker.text()[-3000:]
    assert run.next_step == 2  # step 1 is the failure; no step 2 ever ran on the bad state
    assert "step 1's update left a state the agent's schema refuses" in run.error
    assert "memory.notes.weather" in run.error
    step = Step.objects.get(run=run, number=1)
    assert (step.status, step.crashes, step.failure["where"]) == ("failed", 0, "update")
    assert "fail_error" not in step.failure  # the agent's fail() recorded it in its state

    people = make_people()
    client = Client()
    client.force_login(people["viewer"])
    assert "memory.notes.weather" in client.get(f"/api/runs/{run.pk}").json()["error"]
    assert "memory.notes.weather" in client.get(f"/runs/{run.pk}/").content.decode()


def _startrun_wait(agent: str, timeout: float) -> tuple[int, list[str]]:
    out = StringIO()
    code = 0
    try:
        call_command(
            "startrun",
            agent,
            "--wait",
            "--timeout",
            str(timeout),
            "--input",
            json.dumps({"goal": "weather in Oslo"}),
            stdout=out,
        )
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def test_startrun_wait_says_a_worker_does_not_know_the_agent(start_worker):
    # Finding 12: the worker lacks the agent's module. It parks the run and says why.
    start_worker()  # without AGENTRUN_AGENT_MODULES
    code, lines = _startrun_wait("note_taker", timeout=60)
    assert code == 2, lines
    assert lines[1].startswith("waiting (crashed): step 1:")
    assert "unknown agent 'note_taker'" in lines[1]
    assert "AGENTRUN_AGENT_MODULES" in lines[1]


def test_startrun_wait_says_no_worker_picked_the_run_up():
    code, lines = _startrun_wait("note_taker", timeout=1)
    assert code == 3
    assert "no worker has claimed step 1 yet. Is a worker running" in lines[1]
