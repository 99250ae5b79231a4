"""Hostile JSON from every side, through a real worker.

- What the API accepts, a worker executes: the deepest input allowed runs to the end.
- A tool's result or a model's reply too deep to keep fails its step once, with a
  message that says why: no crash loop, the model asked once.
- A NUL or a lone surrogate from a model or a tool is stored, escaped losslessly
  (␛uXXXX), and shown so: the run goes on, and no decision is requested twice.
"""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.lifecycle import services
from agentrun.models import Run, Step, ToolCall
from agentrun.security.storable import unescape_text
from agentrun.tools import ToolContext, tool
from tests.agentrun.jsonshapes import limit, nest, scripted_input
from tests.agentrun.llm_load import llm_env
from tests.base import calls, final, make_people, script
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, tool_call
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

NUL_TEXT = "before\x00after"
SURROGATE_TEXT = "half \ud800 a pair"


# The worker loads this module (AGENTRUN_AGENT_MODULES).
@tool(kind="read", cache=False)
def deep_result(ctx: ToolContext, levels: int) -> dict:
    return nest(levels)


@tool(kind="read", cache=False)
def unstorable_text(ctx: ToolContext, fail: bool = False, note: str = "") -> dict:
    if fail:
        raise ValueError(f"the service said {NUL_TEXT!s}")
    return {"nul": NUL_TEXT, "surrogate": SURROGATE_TEXT, f"key{NUL_TEXT}": 1}


def finished(run: Run):
    def check() -> bool:
        run.refresh_from_db()
        return run.status not in ("queued", "running")

    return check


def wait_for(run: Run, worker, timeout: float = 60) -> Run:
    try:
        wait_until(finished(run), timeout=timeout, interval=0.2, what="the run to stop")
    except TimeoutError:
        print(worker.text()[-4000:])
        raise
    return run


def test_the_deepest_input_the_api_accepts_runs_to_the_end(start_worker):
    run = services.start_run("scripted", scripted_input(limit()))
    worker = start_worker()
    wait_for(run, worker)
    assert (run.status, run.error) == ("succeeded", "")
    (call,) = ToolCall.objects.filter(run=run)
    assert (
        call.status == "ok" and call.args == scripted_input(limit())["steps"][0]["calls"][0]["args"]
    )
    assert "Error" not in worker.text()


def test_a_tool_result_too_deep_to_keep_fails_its_step_once_and_says_why(start_worker):
    run = services.start_run(
        "scripted", script(calls({"tool": "deep_result", "args": {"levels": 500}}), final())
    )
    worker = start_worker(AGENTRUN_AGENT_MODULES=__name__)
    wait_for(run, worker)
    assert run.status == "failed"
    assert "deep_result ran, but the result" in run.error
    assert f"nests deeper than {limit()} levels" in run.error
    (call,) = ToolCall.objects.filter(run=run)
    assert (call.status, len(call.attempts)) == ("failed", 1)
    step = Step.objects.get(run=run, number=1)
    assert (step.status, step.crashes, step.attempts) == ("failed", 0, 1)


def _deep_then_answer(request: Recorded) -> Reply:
    depth = 500
    arguments = '{"a":' * depth + "1" + "}" * depth
    return Reply(200, completion(tool_calls=[tool_call("echo", arguments)]))


def test_a_model_reply_too_deep_to_keep_fails_the_step_without_asking_again(start_worker):
    with FakeOpenAI(respond=_deep_then_answer) as fake:
        run = services.start_run("llm", {"goal": "go deep", "tools": ["echo"]})
        worker = start_worker(beat=True, **llm_env(fake))
        wait_for(run, worker)
        asked = len(fake.chat_requests())
    assert run.status == "failed"
    assert "the decision can't be stored: calls[0].args" in run.error
    assert f"nests deeper than {limit()} levels" in run.error
    assert asked == 1
    step = Step.objects.get(run=run, number=1)
    assert step.failure["type"] == "InvalidDecision"
    assert step.failure["input"].startswith('{"')  # the start of what the model sent, as text


class UnstorableModel:
    """Turn 0: a tool call whose arguments hold a lone surrogate (and the tool returns a NUL);
    turn 1: an answer with a NUL in it."""

    def __call__(self, request: Recorded) -> Reply:
        turn = sum(1 for m in request.json["messages"] if m["role"] == "tool")
        if turn == 0:
            args = '{"note": "' + "half \\ud800 a pair" + '"}'
            return Reply(
                200,
                completion(
                    "thinking \u0000 aloud",
                    tool_calls=[tool_call("unstorable_text", args)],
                ),
            )
        return Reply(200, completion(f"the answer is {NUL_TEXT}"))


def test_text_the_database_cant_hold_is_stored_escaped_and_never_asked_for_again(start_worker):
    with FakeOpenAI(respond=UnstorableModel()) as fake:
        run = services.start_run("llm", {"goal": "say the unsayable", "tools": ["unstorable_text"]})
        worker = start_worker(beat=True, AGENTRUN_AGENT_MODULES=__name__, **llm_env(fake))
        wait_for(run, worker)
        asked = len(fake.chat_requests())
    assert (run.status, run.error) == ("succeeded", ""), Step.objects.filter(run=run).last().failure
    assert asked == 2  # one request per step: no decision requested twice
    assert list(Step.objects.filter(run=run).values_list("decision_count", flat=True)) == [1, 1]

    # Kept losslessly: unescaping gives back exactly what the model and the tool sent.
    assert "\x00" not in run.final_answer and "␛u0000" in run.final_answer
    assert unescape_text(run.final_answer) == f"the answer is {NUL_TEXT}"
    (call,) = ToolCall.objects.filter(run=run)
    assert unescape_text(call.args["note"]) == SURROGATE_TEXT
    assert unescape_text(call.result["nul"]) == NUL_TEXT
    assert unescape_text(call.result["surrogate"]) == SURROGATE_TEXT
    assert "keybefore␛u0000after" in call.result  # keys too
    step1 = Step.objects.get(run=run, number=1)
    assert unescape_text(step1.decision["thought"]) == "thinking \x00 aloud"

    # Shown escaped, so the operator sees what the model sent.
    page = Client()
    page.force_login(make_people()["viewer"])
    html = page.get(f"/runs/{run.pk}/").content.decode()
    assert "␛u0000" in html


def test_a_tool_error_with_a_nul_in_its_message_fails_the_step_cleanly(start_worker):
    run = services.start_run(
        "scripted", script(calls({"tool": "unstorable_text", "args": {"fail": True}}), final())
    )
    worker = start_worker(AGENTRUN_AGENT_MODULES=__name__)
    wait_for(run, worker)
    assert run.status == "failed"
    assert "the service said before␛u0000after" in run.error
    (call,) = ToolCall.objects.filter(run=run)
    assert call.status == "failed" and unescape_text(call.error).endswith(NUL_TEXT)
    assert Step.objects.get(run=run, number=1).crashes == 0
