"""Traces into a real OTLP receiver, Arize Phoenix (`phoenix serve`), read back through its
REST API: the demo's `llm` and `shop` runs and a fork are one trace each, with the span tree
and the GenAI conventions' attributes, the fork says where it came from, and no secret and
no message content reached Phoenix."""

from __future__ import annotations

import json

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run, Step, ToolCall
from agentrun.telemetry import tracing
from tests.agentrun.llm_load import API_KEY, llm_env
from tests.fake_openai import FakeOpenAI
from tests.telemetry.phoenix import Phoenix, require_phoenix
from tests.telemetry.test_traces_worker import ARG, GOAL, check_chats, check_tree, model, named
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def ended(ids) -> bool:
    active = ("queued", "running", "waiting")
    return not Run.objects.filter(pk__in=ids, status__in=active).exists()


def test_phoenix_reads_back_the_runs_and_a_fork(start_worker, tmp_path):
    require_phoenix()
    phoenix = Phoenix(tmp_path / "phoenix")
    try:
        with FakeOpenAI(respond=model) as fake:
            start_worker(
                OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.url,
                OTEL_BSP_SCHEDULE_DELAY="50",
                **llm_env(fake),
            )
            llm = services.start_run("llm", {"goal": GOAL, "tools": ["echo"]})
            shop = services.start_run(
                "shop",
                {"goal": "camping", "user": "ana", "cart": [{"sku": "TENT-2P", "qty": 1}],
                 "approval": False},
            )  # fmt: skip
            wait_until(lambda: ended([llm.pk, shop.pk]), timeout=120, what="the runs")
            fork = services.fork_run(llm, step=2, at="pre", mode="sandbox")
            wait_until(lambda: ended([fork.pk]), timeout=60, what="the fork")
        runs = [llm, shop, fork]
        wait_until(
            lambda: all(any(not s.parent_id for s in phoenix.trace(r.pk.hex)) for r in runs),
            timeout=60,
            what="the root spans in Phoenix",
        )
        spans = phoenix.spans()
        mapped = phoenix.get("/v1/projects/default/spans?limit=1000")["data"]
        raw = json.dumps(mapped) + json.dumps(
            phoenix.get("/v1/projects/default/spans/otlpv1?limit=1000")
        )
    finally:
        phoenix.stop()

    for run in runs:
        run.refresh_from_db()
    assert [r.status for r in runs] == ["succeeded"] * 3
    # One trace per run, its id the run's.
    assert {s.trace_id for s in spans} == {r.pk.hex for r in runs}

    # The llm run: the tree, a chat span per step with its usage, the tool call.
    trace = [s for s in spans if s.trace_id == llm.pk.hex]
    check_tree(llm, trace)
    check_chats(trace)
    # Phoenix reads the GenAI conventions: its own kinds of span, from gen_ai.operation.name.
    kinds = {s["name"].split(" ")[0]: s["span_kind"] for s in mapped}
    assert kinds == {
        "invoke_agent": "AGENT",
        "chat": "LLM",
        "execute_tool": "TOOL",
        "step": "UNKNOWN",
    }
    (echo,) = named(trace, "execute_tool ")
    assert echo.attributes["gen_ai.tool.name"] == "echo"
    assert echo.attributes["gen_ai.tool.call.id"] == "call_abc"
    assert echo.attributes["gen_ai.tool.type"] == "function"
    assert (
        echo.attributes["agentrun.tool.idempotency_key"]
        == ToolCall.objects.get(run=llm).idempotency_key
    )

    # The shop: every step a span, its tool calls under them.
    trace = [s for s in spans if s.trace_id == shop.pk.hex]
    check_tree(shop, trace)
    tools = named(trace, "execute_tool ")
    assert len(tools) >= ToolCall.objects.filter(run=shop).count() > 5
    assert all(t.attributes["gen_ai.tool.name"] == t.name.split(" ", 1)[1] for t in tools)

    # The fork: a trace of its own that names the parent's step span it came from (Phoenix
    # keeps no span links, so the root's attributes say it too).
    trace = [s for s in spans if s.trace_id == fork.pk.hex]
    root = check_tree(fork, trace)["root"][0]
    parent_step = Step.objects.get(run=llm, number=2)
    parent_span = f"{tracing.step_span_id(llm.pk, 2, parent_step.attempts):016x}"
    assert root.attributes["agentrun.forked_from.run_id"] == str(llm.pk)
    assert root.attributes["agentrun.forked_from.step"] == 2
    assert root.attributes["agentrun.forked_from.span_id"] == parent_span
    assert parent_span in {s.span_id for s in spans if s.trace_id == llm.pk.hex}

    # No secret, no goal, no tool argument, no model output reached Phoenix.
    assert raw.count('"trace_id"') >= 2 * len(spans)  # what is searched holds every span
    for needle in (API_KEY, "PRIVATE-GOAL-TEXT", ARG, "the answer"):
        assert needle not in raw, needle
