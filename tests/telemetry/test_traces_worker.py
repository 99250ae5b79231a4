"""Traces from a real worker to an OTLP/HTTP receiver: one trace per run (its id the run's),
the span tree of the GenAI conventions with their attributes, a fork linked to its parent's
step, retries as events, failures as errors, and no secret and no message content."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run, Step, ToolCall
from agentrun.telemetry import tracing
from tests.agentrun.llm_load import API_KEY, llm_env
from tests.base import calls, final, script
from tests.fake_openai import FakeOpenAI, completion, tool_call
from tests.telemetry.otlp import Receiver, Span
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

GOAL = "Find the PRIVATE-GOAL-TEXT for me"
ARG = "PRIVATE-ARGUMENT-VALUE"
ENDED = ("committed", "finished", "failed")


def model(request):
    if request.json["messages"][-1]["role"] == "tool":
        return completion("the answer", prompt_tokens=120, completion_tokens=30)
    call = tool_call("echo", {"q": ARG}, id="call_abc")
    return completion(tool_calls=[call], prompt_tokens=100, completion_tokens=20)


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s.name.startswith(prefix)]


def check_tree(run: Run, spans: list[Span]) -> dict[str, list[Span]]:
    """The run's trace: one root, a span per step attempt under it, the rest under those."""
    run_hex = run.pk.hex
    assert spans and all(s.trace_id == run_hex for s in spans)
    roots = [s for s in spans if not s.parent_id]
    assert [r.name for r in roots] == [f"invoke_agent {run.agent}"]
    root = roots[0]
    assert root.span_id == f"{tracing.root_span_id(run.pk):016x}"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == run.agent
    assert root.attributes["agentrun.run.id"] == str(run.pk)
    steps = named(spans, "step ")
    assert all(s.parent_id == root.span_id for s in steps)
    step_ids = {s.span_id for s in steps}
    for s in spans:
        if s is not root and s not in steps:
            assert s.parent_id in step_ids, s.name
    # One ended span per committed step, the attempt's own id.
    on_record = {st.number: st for st in Step.objects.filter(run=run)}
    ended = [s for s in steps if s.attributes["agentrun.step.outcome"] in ENDED]
    assert sorted(s.attributes["agentrun.step.number"] for s in ended) == sorted(on_record)
    for s in ended:
        st = on_record[s.attributes["agentrun.step.number"]]
        assert s.span_id == f"{tracing.step_span_id(run.pk, st.number, st.attempts):016x}"
        assert s.attributes["agentrun.step.url"].endswith(f"/runs/{run.pk}/steps/{st.number}/")
        assert s.attributes["agentrun.run.id"] == str(run.pk)
    return {"root": [root], "steps": steps}


def check_chats(spans: list[Span]) -> list[Span]:
    """The llm run's two chat spans, the first with the model's usage and its tool call."""
    chats = sorted(named(spans, "chat "), key=lambda s: s.start_ns)
    assert [c.name for c in chats] == ["chat fake-model", "chat fake-model"]
    first = chats[0].attributes
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.provider.name"] == "openai"
    assert first["gen_ai.request.model"] == first["gen_ai.response.model"] == "fake-model"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (100, 20)
    assert first["gen_ai.response.finish_reasons"] == ["tool_calls"]
    return chats


def test_runs_and_a_fork_are_traces_of_the_genai_conventions(start_worker, tmp_path):
    with Receiver() as receiver, FakeOpenAI(respond=model) as fake:
        start_worker(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_SERVICE_NAME="agentrun-under-test",
            OTEL_BSP_SCHEDULE_DELAY="50",
            **llm_env(fake),
        )
        llm = services.start_run("llm", {"goal": GOAL, "tools": ["echo"]})
        failing = services.start_run(
            "scripted", script(calls({"tool": "fail", "args": {"message": "no luck"}}), final())
        )
        flaky = services.start_run(
            "scripted", script(calls({"tool": "flaky", "args": {"failures": 1}}), final())
        )
        shop = services.start_run(
            "shop",
            {"goal": "camping", "user": "ana", "cart": [{"sku": "TENT-2P", "qty": 1}],
             "approval": False},
        )  # fmt: skip
        runs = [llm, failing, flaky, shop]

        def ended(ids):
            active = ("queued", "running", "waiting")
            return not Run.objects.filter(pk__in=ids, status__in=active).exists()

        wait_until(lambda: ended([r.pk for r in runs]), timeout=120, what="the runs")
        fork = services.fork_run(llm, step=2, at="pre", mode="sandbox")
        wait_until(lambda: ended([fork.pk]), timeout=60, what="the fork")
        runs.append(fork)
        for run in runs:
            wait_until(
                lambda run=run: any(not s.parent_id for s in receiver.trace(run.pk.hex)),
                timeout=30,
                what=f"the root span of {run.agent}",
            )

    for run in runs:
        run.refresh_from_db()
    assert [r.status for r in runs] == ["succeeded", "failed", "succeeded", "succeeded", "succeeded"]  # fmt: skip
    assert all(s.resource.get("service.name") == "agentrun-under-test" for s in receiver.spans)

    # The llm run: a chat span per step, the tool call as execute_tool.
    spans = receiver.trace(llm.pk.hex)
    check_tree(llm, spans)
    chats = check_chats(spans)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert chats[0].kind == 3  # SPAN_KIND_CLIENT
    (echo,) = named(spans, "execute_tool ")
    assert echo.name == "execute_tool echo"
    call = ToolCall.objects.get(run=llm)
    assert echo.attributes["gen_ai.tool.name"] == "echo"
    assert echo.attributes["gen_ai.tool.call.id"] == "call_abc"
    assert echo.attributes["gen_ai.tool.type"] == "function"
    assert echo.attributes["agentrun.tool.idempotency_key"] == call.idempotency_key
    assert echo.start_ns <= echo.end_ns
    # No secret, no message content, no tool arguments or results by default.
    for s in receiver.spans:
        for needle in (API_KEY, "PRIVATE-GOAL-TEXT", ARG, "the answer"):
            assert needle not in s.text(), (needle, s.name)

    # A failed run: its root and its last step are errors, with the failure's type.
    spans = receiver.trace(failing.pk.hex)
    tree = check_tree(failing, spans)
    (root,) = tree["root"]
    assert root.status.get("code") == "STATUS_CODE_ERROR"
    assert root.attributes["agentrun.run.status"] == "failed"
    failed_step = [s for s in tree["steps"] if s.attributes["agentrun.step.outcome"] == "failed"]
    assert len(failed_step) == 1 and failed_step[0].status.get("code") == "STATUS_CODE_ERROR"
    assert failed_step[0].attributes["error.type"] == root.attributes["error.type"] != ""
    (tool,) = named(spans, "execute_tool fail")
    assert tool.status.get("code") == "STATUS_CODE_ERROR"

    # A retried step: one span per attempt, the first marked as a backoff, its tool's failed
    # attempt an event.
    tree = check_tree(flaky, receiver.trace(flaky.pk.hex))
    first_steps = [s for s in tree["steps"] if s.attributes["agentrun.step.number"] == 1]
    assert sorted(s.attributes["agentrun.step.outcome"] for s in first_steps) == ["backoff", "committed"]  # fmt: skip
    assert len({s.span_id for s in first_steps}) == 2
    backoff = next(s for s in first_steps if s.attributes["agentrun.step.outcome"] == "backoff")
    assert [e["name"] for e in backoff.events] == ["agentrun.backoff"]
    tools = named(receiver.trace(flaky.pk.hex), "execute_tool flaky")
    assert any(e["name"] == "agentrun.attempt_failed" for t in tools for e in t.events)

    # The shop: ten steps, each with its tool span.
    spans = receiver.trace(shop.pk.hex)
    check_tree(shop, spans)
    assert len(named(spans, "execute_tool ")) >= ToolCall.objects.filter(run=shop).count() > 5

    # The fork: a trace of its own, linked to the parent's span of the step it came from.
    spans = receiver.trace(fork.pk.hex)
    tree = check_tree(fork, spans)
    (link,) = tree["root"][0].links
    parent_step = Step.objects.get(run=llm, number=2)
    assert link["trace_id"] == llm.pk.hex
    assert link["span_id"] == f"{tracing.step_span_id(llm.pk, 2, parent_step.attempts):016x}"
    assert link["span_id"] in {s.span_id for s in receiver.trace(llm.pk.hex)}
    assert link["agentrun.step.number"] == 2
    # Said as attributes too, for receivers that keep no links.
    root = tree["root"][0].attributes
    assert root["agentrun.forked_from.run_id"] == str(llm.pk)
    assert root["agentrun.forked_from.span_id"] == link["span_id"]
    assert root["agentrun.forked_from.step"] == 2
