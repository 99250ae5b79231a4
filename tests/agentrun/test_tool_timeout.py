"""A tool past its timeout is stopped, and its attempt counts as a transient failure."""

import threading
import time

import pytest

from agentrun import engine
from agentrun.models import ToolCall
from agentrun.tools import RetryPolicy, ToolContext, tool
from tests.base import calls, drive, final, make_run, script

# Committed for real: one test runs the step in another thread, on its own connection.
pytestmark = pytest.mark.django_db(transaction=True)

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
    assert attempt["error"] == "ToolError: test_slow timed out after 0.3s"


def test_a_quick_call_leaves_no_alarm_behind():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    run = drive(make_run(script(calls({"tool": "test_slow", "args": {"seconds": 0.01}}), final())))
    assert run.status == "succeeded"
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
