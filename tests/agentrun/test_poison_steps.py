"""A step that keeps crashing stops being retried; an agent's own bug fails its step.

No run loops forever and none stalls silently: every error is on the run (its
status, error and the step's failure context), not only in a worker's log.
"""

from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from agentrun import engine
from agentrun.agents import AGENTS, Agent, Decision, StepContext, register
from agentrun.lifecycle import services
from agentrun.models import Event, Run, Step
from tests.base import calls, final, make_people, make_run, script

pytestmark = [pytest.mark.django_db, pytest.mark.durability]


class Boom(Exception):
    pass


@pytest.fixture
def crashing_snapshots(monkeypatch):
    """Every post snapshot fails to build: an exception outside any tool."""
    from agentrun.engine import commit
    from agentrun.store import snapshots

    def build(*args: Any, **kwargs: Any) -> Any:
        raise Boom("disk on fire")

    broken = SimpleNamespace(build=build, reference=snapshots.reference)
    monkeypatch.setattr(commit, "snapshots", broken)


def _due_now(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(wake_at=timezone.now())


def test_a_step_that_keeps_crashing_waits_for_an_operator_with_every_crash_on_record(
    crashing_snapshots, settings
):
    settings.AGENTRUN_MAX_STEP_ATTEMPTS = 3
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    for attempt in range(1, 4):
        with pytest.raises(Boom):
            engine.execute_step(run.pk, 1)
        run.refresh_from_db()
        # Handed back with a backoff right away, not after the lease runs out.
        assert (run.status, run.wait_reason, run.lease_owner) == ("waiting", "backoff", "")
        assert Step.objects.get(run=run, number=1).crashes == attempt
        _due_now(run)

    outcome = engine.execute_step(run.pk, 1)  # the fourth claim: no more tries
    assert outcome.status == "waiting"
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == ("waiting", "crashed")
    assert "crashed 3 times" in run.error and "Boom: disk on fire" in run.error
    step = Step.objects.get(run=run, number=1)
    assert step.decision_count == 1  # the decision was stored once and reused
    assert step.failure["type"] == "PoisonStep"
    crashes = step.failure["crashes"]
    assert [c["type"] for c in crashes] == ["Boom"] * 3
    assert all(c["worker"] and c["at"] and "disk on fire" in c["traceback"] for c in crashes)
    assert Event.objects.filter(run=run, kind="step_crashed").count() == 3
    assert Event.objects.filter(run=run, kind="step_poisoned").count() == 1
    # Parked: the reconciler and duplicate messages leave it alone.
    assert engine.execute_step(run.pk, 1).status == "not_claimed"


def test_a_worker_that_died_mid_step_counts_as_a_crash_at_the_next_claim():
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    assert engine.claim(str(run.pk), 1, "host:1:dead") is not None  # ...and then it died
    Run.objects.filter(pk=run.pk).update(lease_expires_at=None)  # its lease ran out
    assert engine.claim(str(run.pk), 1, "host:2:alive") is not None
    step = Step.objects.get(run=run, number=1)
    assert (step.attempts, step.crashes, step.worker) == (2, 1, "host:2:alive")
    (lost,) = step.crash_log
    assert lost["worker"] == "host:1:dead" and "died or lost its lease" in lost["error"]


def test_a_backoff_is_not_a_crash(settings):
    from agentrun.tools import RetryPolicy, ToolError, tool

    @tool(name="test_flaky_once", retry=RetryPolicy(max_attempts=3, initial=0.01), cache=False)
    def flaky(ctx, n: int) -> dict:
        if ctx.attempt == 1:
            raise ToolError("try later", transient=True)
        return {"n": n}

    run = make_run(script(calls({"tool": "test_flaky_once", "args": {"n": 1}}), final()))
    assert engine.execute_step(run.pk, 1).status == "backoff"
    _due_now(run)
    assert engine.execute_step(run.pk, 1).status in ("committed", "finished")
    step = Step.objects.get(run=run, number=1)
    assert (step.attempts, step.crashes) == (2, 0)


def test_an_operator_retries_a_crashed_step_and_it_is_audited(crashing_snapshots, settings):
    settings.AGENTRUN_MAX_STEP_ATTEMPTS = 1
    olga = make_people()["operator"]
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    with pytest.raises(Boom):
        engine.execute_step(run.pk, 1)
    _due_now(run)
    engine.execute_step(run.pk, 1)
    run.refresh_from_db()
    assert run.wait_reason == "crashed"

    services.retry_crashed_step(run, user=olga, reason="disk replaced")
    run.refresh_from_db()
    assert (run.status, run.wait_reason, run.error) == ("running", "", "")
    step = Step.objects.get(run=run, number=1)
    assert step.crashes == 0 and len(step.crash_log) == 1  # the history stays
    retried = Event.objects.get(run=run, kind="step_retried")
    assert (retried.user, retried.reason) == (olga, "disk replaced")
    with pytest.raises(services.ActionError):
        services.retry_crashed_step(run, user=olga)  # only a crashed run


@register
class BrokenUpdateAgent(Agent):
    """Decides fine; its update raises (an agent author's bug)."""

    name = "test_broken_update"
    tools = ("echo",)

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        return {"n": 0}

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        return Decision(thought="go", final="done")

    def update(self, state, decision, results, ctx) -> dict[str, Any]:
        raise ValueError("notes must be strings")


@register
class BrokenEverythingAgent(BrokenUpdateAgent):
    """Its fail() raises too: the state itself is what broke."""

    name = "test_broken_fail"

    def fail(self, state, failure, ctx) -> dict[str, Any]:
        raise ValueError("cannot load my own state")


def test_an_exception_in_the_agents_update_fails_that_step_with_its_context():
    run = make_run({}, agent="test_broken_update")
    assert engine.execute_step(run.pk, 1).status == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and "notes must be strings" in run.error
    failure = Step.objects.get(run=run, number=1).failure
    assert (failure["where"], failure["type"], failure["step"]) == ("update", "ValueError", 1)


def test_when_fail_itself_raises_the_run_still_fails_with_both_errors():
    run = make_run({}, agent="test_broken_fail")
    assert engine.execute_step(run.pk, 1).status == "failed"
    run.refresh_from_db()
    assert run.status == "failed"
    failure = Step.objects.get(run=run, number=1).failure
    assert failure["where"] == "update"
    assert "cannot load my own state" in failure["fail_error"]


def test_a_worker_that_does_not_know_the_agent_says_so_on_the_run():
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    Run.objects.filter(pk=run.pk).update(agent="weather")  # registered where it was started only
    outcome = engine.execute_step(run.pk, 1)
    assert outcome.status == "waiting"
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == ("waiting", "crashed")
    assert "unknown agent 'weather'" in run.error
    assert "AGENTRUN_AGENT_MODULES" in run.error
    assert Event.objects.filter(run=run, kind="unknown_agent").exists()
    assert "weather" not in AGENTS
