"""A tool past its timeout is stopped (in a process's main thread, by SIGALRM) or
abandoned (in any other thread, e.g. Celery's threads pool): a read is retried, an
abandoned side effect is in doubt unless its tool is idempotent."""

import threading
import time

import pytest

from agentrun import engine
from agentrun.models import ToolCall
from agentrun.tools import RetryPolicy, ToolContext, tool
from tests.base import calls, drive, final, make_run, script

# Committed for real: one test runs the step in another thread, on its own connection.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durability]

FINISHED: list[int] = []


@tool(name="test_slow", timeout=0.3, retry=RetryPolicy(max_attempts=2, initial=0.01))
def slow(ctx: ToolContext, seconds: float = 1.0) -> dict:
    time.sleep(seconds)
    FINISHED.append(ctx.attempt)
    return {"slept": seconds}


def _slow_run():
    FINISHED.clear()
    return make_run(script(calls({"tool": "test_slow", "args": {"seconds": 1}}), final("never")))


def test_a_call_past_its_timeout_is_stopped_then_retried_then_fails_the_step():
    started = time.monotonic()
    run = drive(_slow_run(), through_backoff=True)
    assert run.status == "failed"
    attempts = ToolCall.objects.get(run=run).attempts
    assert [a["error"] for a in attempts] == ["ToolError: test_slow timed out after 0.3s"] * 2
    assert time.monotonic() - started < 2
    # Stopped where it was (this is the main thread): neither attempt slept on to finish.
    time.sleep(1.2)
    assert FINISHED == []


def test_away_from_the_main_thread_a_call_past_its_timeout_is_given_up_on_in_its_pool_thread():
    run = _slow_run()
    outcome: list[engine.Outcome] = []
    worker = threading.Thread(target=lambda: outcome.append(engine.execute_step(run.pk, 1)))
    worker.start()
    worker.join(timeout=10)
    assert outcome and outcome[0].status == "backoff"
    attempt = ToolCall.objects.get(run=run).attempts[0]
    assert attempt["error"] == (
        "Abandoned: test_slow timed out after 0.3s and was abandoned (it may still finish)"
    )
    assert attempt["abandoned"] is True and attempt["ended"] is False
    # A thread can't be stopped: the abandoned call went on and finished by itself.
    time.sleep(1.2)
    assert FINISHED == [1]


SENT: list[str] = []


@tool(name="test_slow_send", kind="write", timeout=0.3)
def slow_send(ctx: ToolContext, to: str) -> dict:
    time.sleep(1)
    SENT.append(ctx.idempotency_key)
    return {"sent": to}


@tool(name="test_slow_put", kind="write", timeout=0.3, idempotent=True)
def slow_put(ctx: ToolContext, key: str) -> dict:
    time.sleep(1)
    SENT.append(ctx.idempotency_key)
    return {"put": key}


def _step_in_a_thread(run) -> engine.Outcome:
    outcome: list[engine.Outcome] = []
    worker = threading.Thread(target=lambda: outcome.append(engine.execute_step(run.pk, 1)))
    worker.start()
    worker.join(timeout=10)
    assert outcome
    return outcome[0]


def test_an_abandoned_side_effect_is_in_doubt_and_waits_for_an_operator():
    SENT.clear()
    run = make_run(script(calls({"tool": "test_slow_send", "args": {"to": "ops"}}), final()))
    assert _step_in_a_thread(run).status == "waiting"
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == ("waiting", "in_doubt")
    call = ToolCall.objects.get(run=run)
    assert call.status == "in_doubt"
    assert call.attempts[0]["abandoned"] is True
    time.sleep(1.2)
    assert [call.idempotency_key] == SENT  # it did land, after the step gave up on it


def test_an_abandoned_idempotent_side_effect_is_retried_with_the_same_key():
    SENT.clear()
    run = make_run(script(calls({"tool": "test_slow_put", "args": {"key": "k"}}), final()))
    assert _step_in_a_thread(run).status == "backoff"
    call = ToolCall.objects.get(run=run)
    assert call.status == "intent" and call.attempts[0]["abandoned"] is True


def test_a_quick_call_leaves_no_alarm_behind():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    run = drive(make_run(script(calls({"tool": "test_slow", "args": {"seconds": 0.01}}), final())))
    assert run.status == "succeeded"
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
