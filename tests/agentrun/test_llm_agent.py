"""The `llm` agent against a local fake of the chat-completions API (tests/fake_openai.py)."""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentrun import engine
from agentrun.agents import AgentError, InvalidInput, StepContext, get_agent
from agentrun.builtin import llm_requests
from agentrun.builtin.llm import DEFAULT_CONTEXT_TOKENS, DEFAULT_SYSTEM_PROMPT, _public_url
from agentrun.lifecycle import services
from agentrun.models import Event, Run, Snapshot, Step, ToolCall
from agentrun.state import AgentState, history_to_messages
from agentrun.store import snapshots
from agentrun.tools import REGISTRY
from tests.base import drive
from tests.fake_openai import FakeOpenAI, Reply, completion, error, tool_call

# Shaped like no known token (no sk-, no Bearer in stored text): redact() could not
# hide it, so finding it nowhere proves it was never written, not that it was masked.
API_KEY = "arllm-" + "k3y-7f3a9c2e5b8d41f0a6c3d9e1"
GOAL = "Echo hi, then tell me what came back."


@pytest.fixture
def fake(settings, monkeypatch):
    with FakeOpenAI() as server:
        settings.AGENTRUN_LLM_BASE_URL = server.base_url
        settings.AGENTRUN_LLM_MODEL = "fake-model"
        settings.AGENTRUN_LLM_TIMEOUT = 5.0
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        yield server


def start(**input: Any) -> Run:
    return services.start_run("llm", {"goal": GOAL, **input})


def decide_once(**input: Any):
    """Call decide() for step 1 of a fresh state, without the engine or the database."""
    agent = get_agent("llm")
    inp = {"goal": GOAL, **input}
    agent.validate_input(inp)
    return agent.decide(agent.initial_state(inp), StepContext("run-1", 1, inp))


def decide_error(**input: Any) -> AgentError:
    with pytest.raises(AgentError) as info:
        decide_once(**input)
    return info.value


def assert_valid_conversation(messages: list[dict[str, Any]]) -> None:
    """The chat-completions rule: an assistant message with tool_calls is followed by
    one tool message per call, with matching tool_call_id, and no tool message is orphaned."""
    i = 0
    while i < len(messages):
        msg = messages[i]
        assert msg["role"] != "tool", f"messages[{i}] is a tool message answering nothing"
        i += 1
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            ids = [c["id"] for c in msg["tool_calls"]]
            answered = []
            while i < len(messages) and messages[i]["role"] == "tool":
                answered.append(messages[i]["tool_call_id"])
                i += 1
            assert answered == ids, f"tool messages answer {answered}, the calls were {ids}"


# --------------------------------------------------------------------------
# (1) A tool-call round trip through the engine
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_tool_call_round_trip(fake):
    fake.push(
        completion(
            tool_calls=[tool_call("echo", {"text": "hi"}, id="call_echo_1")],
            prompt_tokens=20,
            completion_tokens=5,
        ),
        completion("The echo said hi.", prompt_tokens=40, completion_tokens=6),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    assert run.final_answer == "The echo said hi."
    first, second = fake.chat_requests()

    # Step 1: the goal and the run's tools as function definitions, one request, no retries.
    body = first.json
    assert body["model"] == "fake-model"
    assert body["messages"] == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": GOAL},
    ]
    assert [t["function"]["name"] for t in body["tools"]] == ["echo", "sleep"]
    for t in body["tools"]:
        registered = REGISTRY[t["function"]["name"]]
        assert t["type"] == "function"
        assert t["function"]["description"] == registered.description
        assert t["function"]["parameters"] == registered.parameters
    assert first.headers["authorization"] == f"Bearer {API_KEY}"
    assert first.headers["content-type"] == "application/json"

    # Step 2: the assistant's tool call and the tool's result, ids matching.
    messages = second.json["messages"]
    assert_valid_conversation(messages)
    assistant, tool = messages[2], messages[3]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [
        {
            "id": "call_echo_1",
            "type": "function",
            "function": {"name": "echo", "arguments": json.dumps({"text": "hi"})},
        }
    ]
    assert tool["role"] == "tool"
    assert tool["tool_call_id"] == "call_echo_1"
    assert json.loads(tool["content"]) == {"text": "hi"}
    assert len(messages) == 4

    step1, step2 = run.steps.order_by("number")
    assert (step1.tokens_in, step1.tokens_out) == (20, 5)
    assert (step2.tokens_in, step2.tokens_out) == (40, 6)
    assert (run.tokens_in, run.tokens_out) == (60, 11)
    assert step1.llm_latency_ms > 0 and step2.llm_latency_ms > 0
    assert step1.decision_count == 1 and step2.decision_count == 1

    decision = step1.decision
    assert decision["calls"] == [{"tool": "echo", "args": {"text": "hi"}, "call_id": "call_echo_1"}]
    assert decision["rationale"] == "model fake-model chose to call echo"
    assert decision["llm"]["model"] == "fake-model"
    assert decision["llm"]["request"]["tools"] == ["echo", "sleep"]
    # The request is a reference into the history: rebuilt, it is the bytes sent.
    assert "messages" in decision["llm"]["request"]
    assert llm_requests.rebuild(step1).bytes == fake.chat_requests()[0].body
    assert llm_requests.rebuild(step2).bytes == fake.chat_requests()[1].body
    assert (
        decision["llm"]["response"]["choices"][0]["message"]["tool_calls"][0]["id"] == "call_echo_1"
    )
    assert step2.decision["final"] == "The echo said hi."
    assert step2.decision["rationale"] == "model fake-model chose to answer"

    echo = ToolCall.objects.get(run=run)
    assert (echo.tool, echo.status, echo.result) == ("echo", "ok", {"text": "hi"})
    final_state = snapshots.load(run.pk, 2, "post")
    assert final_state["phase"] == "done"
    assert final_state["final_answer"] == "The echo said hi."


@pytest.mark.django_db
def test_parallel_tool_calls_make_a_valid_next_request(fake):
    fake.push(
        completion(
            "Two things at once.",
            tool_calls=[
                tool_call("echo", {"n": 1}, id="call_a"),
                tool_call("sleep", {"seconds": 0}, id="call_b"),
            ],
        ),
        completion("done"),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    messages = fake.chat_requests()[1].json["messages"]
    assert_valid_conversation(messages)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[2]["content"] == "Two things at once."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_a", "call_b"]
    assert [m["tool_call_id"] for m in messages[3:]] == ["call_a", "call_b"]
    assert json.loads(messages[4]["content"]) == {"slept": 0}


@pytest.mark.django_db
def test_cached_read_result_keeps_the_models_tool_call_id(fake):
    fake.push(
        completion(tool_calls=[tool_call("echo", {"text": "hi"}, id="call_first")]),
        completion(tool_calls=[tool_call("echo", {"text": "hi"}, id="call_again")]),
        completion("done"),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    messages = fake.chat_requests()[2].json["messages"]
    assert_valid_conversation(messages)
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == [
        "call_first",
        "call_again",
    ]


# --------------------------------------------------------------------------
# (2) The API key is never stored
# --------------------------------------------------------------------------


def stored_text() -> str:
    """Everything the runtime wrote that could hold a secret, as JSON text."""
    rows: list[Any] = []
    rows += list(Step.objects.values_list("decision", "failure"))
    rows += list(Snapshot.objects.values_list("data", flat=True))
    rows += list(Event.objects.values_list("payload", "reason"))
    rows += list(Run.objects.values_list("input", "error", "final_answer"))
    rows += list(ToolCall.objects.values_list("args", "result", "error", "attempts"))
    return json.dumps(rows, default=str)


@pytest.mark.django_db
def test_api_key_is_sent_but_never_stored_or_logged(fake, caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx2", "httpcore2", "agentrun"):
        caplog.set_level(logging.DEBUG, logger=name)
    fake.push(
        completion(tool_calls=[tool_call("echo", {"text": "hi"}, id="call_1")]),
        completion("hi back"),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in fake.chat_requests())
    text = stored_text()
    assert "chat.completion" in text  # the scan does see the stored LLM exchange
    assert API_KEY not in text
    assert API_KEY not in caplog.text


@pytest.mark.django_db
def test_api_key_echoed_by_the_provider_is_not_stored(fake):
    """A provider (or a proxy) that echoes the key in its error body or its answer."""
    fake.push(error(401, f"Incorrect API key provided: {API_KEY}.", "invalid_request_error"))
    failed = drive(start())
    fake.push(completion(f"The key you sent is {API_KEY}"))
    answered = drive(start())

    assert failed.status == "failed"
    assert "HTTP 401" in failed.error
    assert answered.status == "succeeded"
    assert "[REDACTED]" in answered.final_answer
    assert API_KEY not in stored_text()


@pytest.mark.django_db
def test_secrets_in_the_models_answer_are_redacted_before_they_are_stored_or_used(fake):
    token = "sk-proj-" + "Zq8rT2vX9mK4pL7nB3cW6yH1"
    fake.push(
        completion(
            f"calling with {token}",
            tool_calls=[tool_call("echo", {"text": f"key {token}", "password": "hunter2-xyz"})],
        ),
        completion(f"done; the token was {token}"),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    assert "[REDACTED]" in run.final_answer
    step = Step.objects.get(run=run, number=1)
    assert token not in json.dumps(step.decision)
    assert "hunter2-xyz" not in json.dumps(step.decision)
    [call] = ToolCall.objects.filter(step=step)
    assert call.args == {"text": "key [REDACTED]", "password": "[REDACTED]"}
    assert token not in stored_text()
    assert "hunter2-xyz" not in stored_text()


@pytest.mark.django_db
def test_the_request_stored_with_a_decision_holds_no_message(fake):
    """A decision records which messages of the run's history it sent, never the messages
    (the history is stored once, in the state, redacted on its way in): no secret of the
    history is in it, and no text of it at all."""
    token = "ghp_" + "Q7w2E9r4T6y1U8i3O5p0A2s4D6f8G1h3J5k7"
    fake.push(
        completion(tool_calls=[tool_call("echo", {"text": "hi"})]),
        completion("done"),
    )
    run = drive(start(goal=f"Echo hi; password=hunter2-xyz, {token}, key {API_KEY}"))

    assert run.status == "succeeded", run.error
    sent = [json.dumps(r.json["messages"]) for r in fake.chat_requests()]
    assert len(sent) == 2 and all(API_KEY in text for text in sent)
    for step in Step.objects.filter(run=run).order_by("number"):
        stored = json.dumps(step.decision["llm"]["request"])
        assert "Echo hi" not in stored and "hunter2" not in stored and token not in stored
        assert step.decision["llm"]["request"]["messages"] == [[0, 2 * step.number]]
        rebuilt = llm_requests.rebuild(step)
        assert rebuilt.bytes == fake.chat_requests()[step.number - 1].body
        assert "[REDACTED]" in json.dumps(rebuilt.body)  # as the run holds it, and sent it


@pytest.mark.django_db
def test_token_counts_are_parameters_not_new_statements(fake):
    """Every provider answer has its own counts: written into the SQL, each was a new
    statement, cached in the process forever (and prepared anew by the server)."""
    from agentrun.engine import lease
    from agentrun.store import rawsql

    def one_run(n: int) -> Run:
        fake.push(
            completion(
                tool_calls=[tool_call("echo", {"text": "hi"})],
                prompt_tokens=100 + n,
                completion_tokens=10 + n,
            ),
            completion("done", prompt_tokens=200 + n, completion_tokens=20 + n),
        )
        run = drive(start())
        assert run.status == "succeeded", run.error
        return run

    one_run(0)  # every statement shape of such a run, cached once
    sizes = (len(rawsql._STATEMENTS), lease._run_update_sql.cache_info().currsize)
    runs = [one_run(n) for n in (1, 2, 3)]
    assert (len(rawsql._STATEMENTS), lease._run_update_sql.cache_info().currsize) == sizes
    for n, run in zip((1, 2, 3), runs, strict=True):
        run.refresh_from_db()
        assert (run.tokens_in, run.tokens_out) == (300 + 2 * n, 30 + 2 * n)


@pytest.mark.django_db
def test_a_secret_in_tool_arguments_is_not_stored_in_the_words_quoting_them(fake):
    """A tool call without text: the thought quotes its arguments, cut to 60 characters,
    which would cut a secret where redaction no longer sees it."""
    secret = "hunter2-" + "secret-value-123456"
    fake.push(
        completion(tool_calls=[tool_call("echo", {"text": "hello there", "password": secret})]),
        completion("done"),
    )
    run = drive(start())

    assert run.status == "succeeded", run.error
    step = Step.objects.get(run=run, number=1)
    assert step.decision["thought"].startswith("call echo")
    assert "hunter2" not in json.dumps(step.decision)
    assert "hunter2" not in stored_text()


def test_api_key_is_read_at_call_time(fake, monkeypatch):
    fake.push(completion("one"), completion("two"), completion("three"))
    decide_once()
    monkeypatch.setenv("AGENTRUN_LLM_API_KEY", "arllm-rotated-key-0123456789")
    decide_once()
    monkeypatch.delenv("AGENTRUN_LLM_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "arllm-openai-fallback-key-42")
    decide_once()

    sent = [r.headers["authorization"] for r in fake.chat_requests()]
    assert sent == [
        f"Bearer {API_KEY}",
        "Bearer arllm-rotated-key-0123456789",
        "Bearer arllm-openai-fallback-key-42",
    ]


def test_recorded_base_url_drops_credentials():
    assert _public_url("https://user:pw@llm.example/v1?api_key=x#f") == "https://llm.example/v1"
    assert _public_url("http://[::1]:8080/v1") == "http://[::1]:8080/v1"


def test_no_api_key_is_a_permanent_error_without_a_request(fake, monkeypatch):
    monkeypatch.delenv("AGENTRUN_LLM_API_KEY")
    exc = decide_error()
    assert not exc.transient
    assert "AGENTRUN_LLM_API_KEY" in str(exc)
    assert fake.requests == []


def test_an_api_key_with_a_line_break_is_refused_without_quoting_it(fake, monkeypatch):
    monkeypatch.setenv("AGENTRUN_LLM_API_KEY", "arllm-first-half\nsecond-half-xyz")
    exc = decide_error()
    assert not exc.transient
    assert "AGENTRUN_LLM_API_KEY" in str(exc)
    assert "second-half-xyz" not in str(exc) and "second-half-xyz" not in repr(exc.detail)
    assert fake.requests == []


# --------------------------------------------------------------------------
# (3) Provider errors
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_permanent_provider_error_fails_the_run(fake):
    fake.push(error(400, "Invalid value for 'model': 'nope'.", "invalid_request_error"))
    run = drive(start())

    assert run.status == "failed"
    assert len(fake.chat_requests()) == 1  # no SDK retries
    assert "HTTP 400" in run.error and "Invalid value for 'model'" in run.error
    step = run.steps.get()
    assert step.status == "failed"
    assert step.decision is None
    failure = step.failure
    assert failure["where"] == "decide"
    assert failure["type"] == "AgentError"
    assert "HTTP 400" in failure["message"]
    detail = failure["detail"]
    assert detail["status"] == 400
    assert detail["transient"] is False
    assert detail["provider_error"] == "BadRequestError"
    assert detail["request_id"] == "req_fake"
    assert "Invalid value for 'model'" in detail["body"]
    post = snapshots.load(run.pk, 1, "post")
    assert post["phase"] == "error"
    assert post["failures"][-1]["detail"]["status"] == 400


@pytest.mark.django_db
def test_transient_provider_error_is_retried_with_backoff(fake):
    fake.push(
        error(500, "The server had an error while processing your request."),
        completion("recovered"),
    )
    run = drive(start())

    # The step backs off (the wake-up time in the database) instead of failing...
    assert run.status == "waiting", run.error
    assert run.wait_reason == "backoff"
    assert run.wake_at is not None
    step = run.steps.get()
    assert step.status != "failed"
    assert step.decision is None
    # ...and at the next attempt the decision is asked again.
    Run.objects.filter(pk=run.pk).update(wake_at=timezone.now() - timedelta(seconds=1))
    engine.execute_step(run.pk, run.next_step)
    run = drive(run)
    assert run.status == "succeeded", run.error
    assert run.final_answer == "recovered"
    assert len(fake.chat_requests()) == 2
    step.refresh_from_db()
    assert step.attempts == 2
    assert step.decision_count == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retryable_statuses_are_transient(fake, status):
    fake.push(Reply(status, {"error": {"message": "try later"}}, headers={"Retry-After": "3"}))
    exc = decide_error()
    assert exc.transient is True
    assert exc.detail["status"] == status
    assert exc.detail["transient"] is True
    assert exc.detail["retry_after"] == "3"
    assert f"HTTP {status}" in str(exc) and "try later" in str(exc)
    assert len(fake.chat_requests()) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_other_client_errors_are_permanent(fake, status):
    fake.push(error(status, "no", "invalid_request_error"))
    exc = decide_error()
    assert exc.transient is False
    assert exc.detail["status"] == status
    assert len(fake.chat_requests()) == 1


def test_timeout_is_transient(fake, settings):
    settings.AGENTRUN_LLM_TIMEOUT = 0.3
    fake.push(Reply(200, completion("too late"), delay=1.5))
    exc = decide_error()
    assert exc.transient is True
    assert "timed out after 0.3s" in str(exc)
    assert exc.detail["provider_error"] == "APITimeoutError"


def test_dropped_connection_is_transient(fake):
    fake.push(Reply(drop=True))
    exc = decide_error()
    assert exc.transient is True
    assert exc.detail["provider_error"] == "APIConnectionError"


def test_connection_refused_is_transient(fake, settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.AGENTRUN_LLM_BASE_URL = f"http://127.0.0.1:{port}/v1"
    exc = decide_error()
    assert exc.transient is True
    assert "could not connect" in str(exc)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(200, "<html>gateway</html>"), "not JSON"),
        (Reply(200, [1, 2]), "JSON array, not an object"),
        (Reply(200, {"object": "chat.completion", "choices": []}), "no choices[0].message"),
        (Reply(200, {"error": {"message": "model overloaded"}}), "model overloaded"),
        (completion(None), "neither tool calls nor an answer"),
    ],
)
def test_unusable_responses_are_permanent_errors(fake, reply, message):
    fake.push(reply)
    exc = decide_error()
    assert exc.transient is False
    assert message in str(exc)


# --------------------------------------------------------------------------
# (4) Tool calls the agent can't run
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_malformed_tool_arguments_fail_the_run_with_the_raw_content(fake):
    raw = '{"text": "hi"'
    fake.push(completion(tool_calls=[tool_call("echo", raw, id="call_bad")]))
    run = drive(start())

    assert run.status == "failed"
    assert "malformed JSON arguments for echo" in run.error
    failure = run.steps.get().failure
    assert failure["type"] == "AgentError"
    assert failure["detail"]["raw"] == raw
    assert failure["detail"]["tool_call_id"] == "call_bad"
    assert (
        failure["detail"]["response"]["choices"][0]["message"]["tool_calls"][0]["function"][
            "arguments"
        ]
        == raw
    )
    assert not ToolCall.objects.filter(run=run).exists()
    assert len(fake.chat_requests()) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (tool_call("echo", '{"text": "hi"'), "malformed JSON arguments for echo"),
        (tool_call("echo", "[1, 2]"), "arguments for echo that are a JSON array"),
        (tool_call("rm_rf", {"path": "/"}), "asked for unknown tool 'rm_rf'"),
        (
            tool_call("ledger_write", {"account": "a", "amount": 1}),
            "asked for a tool not given to this run 'ledger_write' (this run's tools: echo, sleep)",
        ),
        (tool_call("sleep", {"secs": 1}), "don't fit sleep: unknown argument(s) secs"),
        ({"id": "x", "type": "custom", "custom": {"name": "echo"}}, "not a function call"),
    ],
)
def test_tool_calls_that_cant_run_are_permanent_errors(fake, call, message):
    fake.push(completion(tool_calls=[call]))
    exc = decide_error()
    assert exc.transient is False
    assert message in str(exc)
    assert "response" in exc.detail


def test_empty_arguments_mean_no_arguments(fake):
    fake.push(completion(tool_calls=[tool_call("sleep", "", id="c1")]))
    decision = decide_once()
    assert [(c.tool, c.args, c.call_id) for c in decision.calls] == [("sleep", {}, "c1")]
    assert decision.thought == "call sleep {}"


# --------------------------------------------------------------------------
# Per-run options, context budget, usage
# --------------------------------------------------------------------------


def test_model_system_and_tools_come_from_the_input(fake):
    fake.push(completion("ok", model="other-model"))
    decision = decide_once(model="other-model", system="Be terse.", tools=["echo"])

    body = fake.chat_requests()[0].json
    assert body["model"] == "other-model"
    assert body["messages"][0] == {"role": "system", "content": "Be terse."}
    assert [t["function"]["name"] for t in body["tools"]] == ["echo"]
    assert decision.rationale == "model other-model chose to answer"
    assert decision.llm["model"] == "other-model"


def test_no_tools_and_no_system_prompt(fake):
    fake.push(completion("just an answer"))
    decision = decide_once(tools=[], system="")

    body = fake.chat_requests()[0].json
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": GOAL}]
    assert decision.final == "just an answer"


def test_history_is_truncated_to_the_budget(fake):
    agent = get_agent("llm")
    inp = {"goal": GOAL, "max_tokens_context": 200}
    agent.validate_input(inp)
    st = AgentState.from_dict(agent.initial_state(inp))
    st.to("planning")
    for i in range(20):
        st.add_message("assistant", f"thinking {i} " + "x" * 200)
        st.add_message("user", f"more {i}")
    fake.push(completion("fits"))
    decision = agent.decide(st.to_dict(), StepContext("run-1", 21, inp))

    sent = fake.chat_requests()[0].json["messages"]
    assert sent[0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert sent[-1] == {"role": "user", "content": "more 19"}
    assert len(sent) < len(st.history)
    history = history_to_messages(st)
    kept = llm_requests.positions(decision.llm["request"]["messages"])
    assert [history[i] for i in kept] == sent and kept[0] == 0  # the system message kept
    assert decision.llm["request"]["dropped_messages"] == len(st.history) - len(sent)
    assert DEFAULT_CONTEXT_TOKENS > 200


def test_missing_usage_is_estimated(fake):
    fake.push(completion("no usage here", prompt_tokens=None, completion_tokens=None))
    decision = decide_once()
    assert decision.llm["tokens_estimated"] is True
    assert decision.llm["tokens_in"] > 0 and decision.llm["tokens_out"] > 0


def test_refusal_is_the_final_answer(fake):
    body = completion(None)
    body["choices"][0]["message"]["refusal"] = "I can't help with that."
    fake.push(body)
    decision = decide_once()
    assert decision.final == "I can't help with that."
    assert decision.rationale == "model fake-model chose to refuse"


# --------------------------------------------------------------------------
# (5) Input validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("input", "message"),
    [
        ([], "input must be a JSON object"),
        ({}, "goal must be a non-empty string, got null"),
        ({"goal": "  "}, "goal must be a non-empty string, got an empty string"),
        ({"goal": 3}, "goal must be a non-empty string, got number"),
        (
            {"goal": "g", "base_url": "http://elsewhere"},
            "unknown key(s) base_url (allowed: goal, tools, system, model, max_tokens_context)",
        ),
        ({"goal": "g", "tools": "echo"}, "tools must be a list of tool names, got string"),
        ({"goal": "g", "tools": [1]}, "tools[0] must be a tool name (string), got number"),
        ({"goal": "g", "tools": ["echo", "nope"]}, "tools[1]: unknown tool 'nope' (known: "),
        ({"goal": "g", "tools": ["echo", "echo"]}, "tools[1]: tool 'echo' is listed twice"),
        ({"goal": "g", "tools": ["echo"] * 129}, "tools: at most 128 tools, got 129"),
        ({"goal": "g", "system": 5}, "system must be a string, got number"),
        ({"goal": "g", "model": ""}, "model must be a non-empty string, got an empty string"),
        ({"goal": "g", "model": ["gpt"]}, "model must be a non-empty string, got array"),
        (
            {"goal": "g", "max_tokens_context": "8k"},
            "max_tokens_context must be an integer, got string",
        ),
        (
            {"goal": "g", "max_tokens_context": True},
            "max_tokens_context must be an integer, got boolean",
        ),
        (
            {"goal": "g", "max_tokens_context": 1.5},
            "max_tokens_context must be an integer, got number",
        ),
        (
            {"goal": "g", "max_tokens_context": 0},
            "max_tokens_context must be between 1 and 10000000, got 0",
        ),
    ],
)
def test_invalid_input_is_refused_precisely(input, message):
    with pytest.raises(InvalidInput) as info:
        get_agent("llm").validate_input(input)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    "input",
    [
        {"goal": "g"},
        {"goal": "g", "tools": [], "system": "", "model": "m", "max_tokens_context": 1},
        {
            "goal": "g",
            "tools": ["echo", "ledger_write"],
            "system": None,
            "model": None,
            "max_tokens_context": None,
        },
    ],
)
def test_valid_input(input):
    get_agent("llm").validate_input(input)


@pytest.mark.django_db
def test_start_run_refuses_invalid_input_and_writes_nothing():
    with pytest.raises(InvalidInput, match="tools\\[0\\]: unknown tool 'nope'"):
        services.start_run("llm", {"goal": "g", "tools": ["nope"]})
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_api_shows_a_steps_request_exactly_and_what_it_added(fake):
    from django.test import Client

    from tests.base import make_people

    fake.push(completion(tool_calls=[tool_call("echo", {"text": "hi"})]), completion("done"))
    run = drive(start())
    client = Client()
    client.force_login(make_people()["viewer"])
    raw = client.get(f"/api/runs/{run.pk}/steps/2/request/body")
    assert raw.status_code == 200 and raw.content == fake.chat_requests()[1].body
    shown = client.get(f"/api/runs/{run.pk}/steps/2/request").json()
    assert shown["exact"] is True and shown["bytes"] == len(raw.content)
    assert (shown["previous_step"], shown["added"], shown["dropped"]) == (1, [2, 3], [])
    assert shown["body"]["messages"][-1]["role"] == "tool"
    missing = client.get(f"/api/runs/{run.pk}/steps/9/request")
    assert missing.status_code == 404 and "no step 9" in missing.json()["detail"]


@pytest.mark.django_db
def test_tokens_cached_and_cost_per_step_and_run_at_the_configured_prices(fake, settings):
    settings.AGENTRUN_LLM_PRICES = json.dumps(
        {"fake-model": {"input": 2.0, "output": 8.0, "cached_input": 0.5}}
    )
    first = completion(
        tool_calls=[tool_call("echo", {"text": "hi"})], prompt_tokens=20, completion_tokens=5
    )
    first["usage"]["prompt_tokens_details"] = {"cached_tokens": 10}
    fake.push(first, completion("done", prompt_tokens=40, completion_tokens=6))
    run = drive(start())
    step1, step2 = run.steps.order_by("number")
    assert (step1.tokens_in, step1.tokens_out, step1.tokens_cached) == (20, 5, 10)
    assert step1.cost_usd == pytest.approx((10 * 2.0 + 10 * 0.5 + 5 * 8.0) / 1e6)
    assert step2.cost_usd == pytest.approx((40 * 2.0 + 6 * 8.0) / 1e6)
    assert run.tokens_cached == 10
    assert run.cost_usd == pytest.approx(step1.cost_usd + step2.cost_usd)


@pytest.mark.django_db
def test_a_model_without_a_price_costs_nothing_known(fake, settings):
    settings.AGENTRUN_LLM_PRICES = json.dumps({"another-model": {"input": 1, "output": 1}})
    fake.push(completion("done"))
    run = drive(start())
    assert run.steps.get().cost_usd is None and run.cost_usd == 0


def test_a_bad_price_table_is_a_clear_configuration_error(settings):
    from django.core.exceptions import ImproperlyConfigured

    from agentrun.builtin import llm_costs

    for bad, said in [
        ("{", "not JSON"),
        ('{"m": {"input": 1}}', "needs input and output"),
        ('{"m": {"input": 1, "output": -1}}', "0 or more"),
        ('{"m": {"input": 1, "output": 1, "cache": 1}}', "unknown cache"),
    ]:
        settings.AGENTRUN_LLM_PRICES = bad
        with pytest.raises(ImproperlyConfigured, match=said):
            llm_costs.prices()


@pytest.mark.django_db
def test_an_exported_llm_run_imported_elsewhere_rebuilds_the_same_requests(fake, tmp_path):
    import hashlib
    import subprocess
    import sys

    from agentrun.lifecycle import archive
    from tests.workers import ROOT, worker_env

    fake.push(completion(tool_calls=[tool_call("echo", {"text": "hi"})]), completion("done"))
    run = drive(start())
    here = [
        hashlib.sha256(llm_requests.rebuild(s).bytes).hexdigest()
        for s in run.steps.order_by("number")
    ]
    path = tmp_path / "run.agentrun.jsonl.gz"
    path.write_bytes(b"".join(archive.export_chunks(run)))
    elsewhere = worker_env(AGENTRUN_VAR_DIR=str(tmp_path / "elsewhere"))
    elsewhere.pop("DATABASE_URL")  # an embedded database of its own
    script = (
        "import hashlib; from agentrun.models import Step; "
        "from agentrun.builtin import llm_requests; "
        f"print([hashlib.sha256(llm_requests.rebuild(s).bytes).hexdigest() for s in "
        f"Step.objects.filter(run_id='{run.pk}').order_by('number')])"
    )
    for command in (["migrate", "-v0"], ["importrun", str(path)], ["shell", "-c", script]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command], cwd=ROOT, env=elsewhere,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(here)


@pytest.mark.parametrize(
    "messages, definitions",
    [
        ([], None),
        ([{"role": "user", "content": "hi"}], None),
        (
            [
                {"role": "system", "content": "Ünïcode \u2028 \"quoted\" \\ \n</script>"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "echo", "arguments": "{\"text\": \"\\u00e9\"}"}}]},
                {"role": "tool", "content": "{\"ok\": 1.5e300}", "tool_call_id": "c1"},
            ],
            [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}],
        ),
    ],
)  # fmt: skip
def test_a_body_joined_from_each_messages_json_is_the_body_json_encodes(messages, definitions):
    body: dict[str, Any] = {"model": "m\u00f6del", "messages": messages}
    if definitions:
        body["tools"] = definitions
    texts = [json.dumps(m).encode() for m in messages]
    assert llm_requests.join("m\u00f6del", texts, definitions) == llm_requests.encode(body)


def test_a_history_changed_under_the_runs_window_is_sent_as_it_now_is(fake):
    """The window of a run's last decision is extended when the history grew by new
    messages, and made anew when an earlier message is another object (an edited state)."""
    agent = get_agent("llm")
    inp = {"goal": GOAL}
    st = AgentState.from_dict(agent.initial_state(inp))
    st.to("planning")
    st.add_message("assistant", "first answer")
    first = st.to_dict()
    st.add_message("user", "and then?")
    grown = st.to_dict()  # the same message objects, one more
    edited = {**grown, "history": list(grown["history"])}
    edited["history"][2] = {"role": "assistant", "content": "an edited answer"}
    for state in (first, grown, edited):
        fake.push(completion("ok"))
        agent.decide(state, StepContext("run-window", 2, inp))
    sent = fake.chat_requests()
    for state, request in zip((first, grown, edited), sent, strict=True):
        expected = {"model": "fake-model", "messages": history_to_messages(state["history"])}
        expected["tools"] = request.json["tools"]
        assert request.body == llm_requests.encode(expected)
    assert sent[2].json["messages"][2]["content"] == "an edited answer"


def test_the_windows_a_process_keeps_are_bounded_by_the_bytes_of_their_messages(fake, settings):
    from agentrun.builtin import llm as llm_module

    settings.AGENTRUN_STATE_CACHE_MB = 1  # the windows' budget: an eighth, 128 KiB of JSON
    agent = get_agent("llm")
    inp = {"goal": GOAL}

    def decide(run_id: str, size: int) -> None:
        st = AgentState.from_dict(agent.initial_state(inp))
        st.to("planning")
        st.add_message("user", "x" * size)
        fake.push(completion("ok"))
        agent.decide(st.to_dict(), StepContext(run_id, 2, inp))

    for i in range(6):
        decide(f"bounded-{i}", 40_000)
    kept = llm_module._WINDOWS
    assert llm_module._windows_bytes == sum(size for _, _, size in kept.values()) <= 128 * 1024
    assert "bounded-5" in kept and "bounded-4" in kept and "bounded-0" not in kept
    decide("bounded-huge", 200_000)  # more than the whole budget: not kept at all
    assert "bounded-huge" not in kept and "bounded-5" in kept
