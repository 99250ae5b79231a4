"""Registered graphs executed by agentrun's engine, one super-step a step, in this
process (the worker tests run them in real worker processes)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402

from agentrun.agents import InvalidInput  # noqa: E402
from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.integrations.langgraph.plain import plain  # noqa: E402
from agentrun.lifecycle import services  # noqa: E402
from agentrun.models import Run, Step  # noqa: E402
from agentrun.store import snapshots  # noqa: E402
from tests.base import drive  # noqa: E402
from tests.fake_openai import completion, tool_call  # noqa: E402
from tests.langgraph.conftest import ORDERS  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_started_graph_runs_one_super_step_a_step(orders_fake):
    orders_fake.push(completion(tool_calls=[tool_call("lookup_order", {"order_id": "7"})]))
    orders_fake.push(completion("Order 7 shipped."))
    run = services.start_run(
        "langgraph",
        {
            "graph": ORDERS,
            "thread_id": "durable-7",
            "input": {"messages": [{"type": "human", "content": "Where is order 7?"}]},
        },
    )
    assert run.pk == run_id_for("durable-7")
    run = drive(run)
    assert run.status == "succeeded", run.error
    assert run.final_answer == "Order 7 shipped."
    steps = list(Step.objects.filter(run=run).order_by("number"))
    assert [s.decision["langgraph"]["nodes"] for s in steps] == [
        [],
        ["__start__"],
        ["agent"],
        ["tools"],
        ["agent"],
    ]
    post = snapshots.load(run.pk, steps[-1].number, "post")
    assert [m["type"] for m in post["messages"]] == ["human", "ai", "tool", "ai"]
    # LangGraph reads the thread back through the saver, with its own objects.
    state = orders_graph_state("durable-7")
    assert isinstance(state.values["messages"][2], ToolMessage)
    assert state.values["messages"][-1].content == "Order 7 shipped."
    assert len(orders_fake.chat_requests()) == 2

    # A recorded fork of this run (the engine's steps) reads its checkpoints the same way.
    fork = drive(services.fork_run(run, step=4, at="pre", mode="recorded"))
    assert fork.status == "succeeded", fork.error
    assert fork.divergence_step is None and len(orders_fake.chat_requests()) == 2
    assert orders_graph_state(fork.input["thread_id"]).values == state.values


def orders_graph_state(thread: str):
    from agentrun.integrations.langgraph.driven import graph_named

    graph = graph_named(ORDERS).copy(update={"checkpointer": AgentrunSaver()})
    return graph.get_state({"configurable": {"thread_id": thread}})


def test_a_fork_with_an_edited_message_goes_on_from_the_edit(ran_orders, orders_fake):
    parent = Run.objects.get(pk=run_id_for("order-42"))
    # Step 4 ran the tool; fork from its post snapshot with the tool's answer edited.
    state = snapshots.load(parent.pk, 4, "post")
    state["messages"][2]["content"] = "order 42: lost in transit"
    orders_fake.push(completion("Order 42 was lost; we are sending another."))
    fork = services.fork_run(parent, step=4, at="post", state=state, mode="live")
    assert fork.parent_id == parent.pk
    thread = fork.input["thread_id"]
    assert thread.startswith("order-42~") and fork.pk == run_id_for(thread)
    fork = drive(fork)
    assert fork.status == "succeeded", fork.error
    assert fork.final_answer == "Order 42 was lost; we are sending another."
    # The model saw the edited tool message.
    sent = orders_fake.chat_requests()[-1].json["messages"]
    assert sent[-1]["content"] == "order 42: lost in transit"
    values = orders_graph_state(thread).values["messages"]
    assert isinstance(values[1], AIMessage) and isinstance(values[2], ToolMessage)
    assert values[2].content == "order 42: lost in transit"
    assert values[2].tool_call_id == "call_1"
    # The parent is unchanged.
    assert snapshots.load(parent.pk, 4, "post")["messages"][2]["content"] == (
        "order 42: shipped on May 2"
    )


def test_an_unregistered_graph_is_refused_and_nothing_is_made(ran_orders, settings):
    settings.AGENTRUN_LANGGRAPH_GRAPHS = []
    parent = Run.objects.get(pk=run_id_for("order-42"))
    before = Run.objects.count()
    with pytest.raises(services.ForkError, match="AGENTRUN_LANGGRAPH_GRAPHS"):
        services.fork_run(parent, step=4, at="post")
    with pytest.raises(InvalidInput, match="not registered"):
        services.start_run("langgraph", {"graph": ORDERS, "thread_id": "x"})
    assert Run.objects.count() == before


def test_a_recorded_fork_answers_from_the_parents_record(ran_orders, orders_fake):
    """Unedited, a recorded fork from before the tool step re-executes the tool and model
    nodes, and both answer from the parent's record: no request reaches the model."""
    parent = Run.objects.get(pk=run_id_for("order-42"))
    asked = len(orders_fake.chat_requests())
    fork = drive(services.fork_run(parent, step=4, at="pre", mode="recorded"))
    assert fork.status == "succeeded", fork.error
    assert len(orders_fake.chat_requests()) == asked
    assert fork.final_answer == "Your order 42 shipped on May 2."
    assert fork.divergence_step is None
    for n in (4, 5):
        assert snapshots.load(fork.pk, n, "post") == snapshots.load(parent.pk, n, "post")
    from debugger.compare import align

    assert align(parent, fork).first_divergence is None


def test_a_recorded_fork_diverges_where_its_state_is_edited(ran_orders, orders_fake):
    parent = Run.objects.get(pk=run_id_for("order-42"))
    state = snapshots.load(parent.pk, 4, "post")
    state["messages"][2]["content"] = "order 42: lost in transit"
    orders_fake.push(completion("Order 42 was lost."))
    fork = drive(services.fork_run(parent, step=4, at="post", state=state, mode="recorded"))
    assert fork.status == "succeeded", fork.error
    assert fork.divergence_step == 5
    assert fork.final_answer == "Order 42 was lost."  # asked the model, past the divergence
    assert fork.events.filter(kind="diverged", step=5).exists()


def test_a_sandbox_fork_runs_no_tool(ran_orders, orders_fake):
    """The model asked for another order: in a sandbox the tool is not run; the parent
    has no result for that call, so the tool's message says it was skipped."""
    from agentrun.integrations.langgraph.recorded import SKIPPED

    parent = Run.objects.get(pk=run_id_for("order-42"))
    state = snapshots.load(parent.pk, 3, "post")
    state["messages"][1]["tool_calls"][0]["args"]["order_id"] = "43"
    orders_fake.push(completion("I could not look order 43 up."))
    fork = drive(services.fork_run(parent, step=3, at="post", state=state, mode="sandbox"))
    assert fork.status == "succeeded", fork.error
    tool_message = snapshots.load(fork.pk, 4, "post")["messages"][2]
    assert tool_message["content"] == SKIPPED.format(tool="lookup_order")
    assert fork.final_answer == "I could not look order 43 up."

    # The same call as the parent's answers with the parent's result, without running.
    orders_fake.push(completion("Shipped."))  # a sandbox asks the model
    same = drive(services.fork_run(parent, step=4, at="pre", mode="sandbox"))
    assert same.status == "succeeded" and same.final_answer == "Shipped.", same.error
    assert snapshots.load(same.pk, 4, "post")["messages"][2]["content"] == (
        "order 42: shipped on May 2"
    )


def test_the_startrun_and_fork_commands(orders_fake, ran_orders):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    orders_fake.push(completion("Hello."))
    call_command(
        "startrun",
        "langgraph",
        "--input",
        json.dumps(
            {"graph": ORDERS, "thread_id": "cli-1", "input": {"messages": [["human", "hi"]]}}
        ),
        stdout=out,
    )
    run = drive(Run.objects.get(pk=run_id_for("cli-1")))
    assert run.status == "succeeded" and run.final_answer == "Hello."
    parent = Run.objects.get(pk=run_id_for("order-42"))
    out = StringIO()
    call_command("fork", str(parent.pk), "4", "--at", "pre", "--mode", "recorded", stdout=out)
    fork = drive(Run.objects.get(pk=out.getvalue().split()[0]))
    assert fork.status == "succeeded" and fork.parent_id == parent.pk


def test_the_api_refuses_unregistered_graphs_with_4xx_and_writes_nothing(
    ran_orders, settings, monkeypatch
):
    from django.test import Client

    from agentrun import agents
    from agentrun.models import ApiToken, Event
    from tests.base import make_people

    operator = make_people()["operator"]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(operator)}")
    parent = Run.objects.get(pk=run_id_for("order-42"))
    runs, events = Run.objects.count(), Event.objects.count()

    def fork():
        return api.post(
            f"/api/runs/{parent.pk}/fork",
            {"step": 4, "at": "post", "mode": "live"},
            content_type="application/json",
        )

    def start(graph):
        return api.post(
            "/api/runs",
            {"agent": "langgraph", "input": {"graph": graph, "thread_id": "new-1"}},
            content_type="application/json",
        )

    settings.AGENTRUN_LANGGRAPH_GRAPHS = []  # the agent is there, no graph is registered
    refused = fork()
    assert refused.status_code == 400, refused.content
    assert "AGENTRUN_LANGGRAPH_GRAPHS" in refused.json()["detail"]
    refused = start(ORDERS)
    assert refused.status_code == 400 and "is not registered" in refused.json()["detail"]
    # A deployment that registers no graph at all has no `langgraph` agent.
    monkeypatch.delitem(agents.AGENTS, "langgraph")
    refused = fork()
    assert refused.status_code == 409, refused.content
    assert "AGENTRUN_LANGGRAPH_GRAPHS" in refused.json()["detail"]
    assert start(ORDERS).status_code == 400
    assert (Run.objects.count(), Event.objects.count()) == (runs, events)


def test_a_thread_that_has_a_run_is_not_started_again(orders_fake, ran_orders):
    with pytest.raises(InvalidInput, match="has a run already"):
        services.start_run("langgraph", {"graph": ORDERS, "thread_id": "order-42"})
    with pytest.raises(InvalidInput, match="unknown input field"):
        services.start_run("langgraph", {"graph": ORDERS, "thread_id": "t", "inputs": {}})


def test_a_graph_with_a_channel_named_like_a_secret_fails_its_step_saying_why(settings):
    """Its checkpoint's record would be redacted on the way to the database."""
    settings.AGENTRUN_LANGGRAPH_GRAPHS = ["tests.langgraph.test_driven:TOKEN_GRAPH"]
    run = drive(
        services.start_run(
            "langgraph",
            {"graph": settings.AGENTRUN_LANGGRAPH_GRAPHS[0], "thread_id": "tok", "input": {}},
        )
    )
    assert run.status == "failed"
    assert "'api_token' is named like a secret" in run.error


def _token_graph():
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class State(TypedDict):
        api_token: str

    builder = StateGraph(State)
    builder.add_node("use", lambda s: {"api_token": "x"})
    builder.add_edge(START, "use")
    return builder.compile()


TOKEN_GRAPH = _token_graph()


def test_a_graph_whose_nodes_are_coroutines_runs_too(settings):
    settings.AGENTRUN_LANGGRAPH_GRAPHS = ["tests.langgraph.test_driven:ASYNC_GRAPH"]
    run = drive(
        services.start_run(
            "langgraph",
            {"graph": settings.AGENTRUN_LANGGRAPH_GRAPHS[0], "thread_id": "co", "input": {"n": 1}},
        )
    )
    assert run.status == "succeeded", run.error
    assert snapshots.load(run.pk, run.next_step - 1, "post")["n"] == 4


def _async_graph():
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class State(TypedDict):
        n: int

    async def double(s):
        return {"n": s["n"] * 2}

    builder = StateGraph(State)
    builder.add_node("once", double)
    builder.add_node("twice", double)
    builder.add_edge(START, "once")
    builder.add_edge("once", "twice")
    return builder.compile()


ASYNC_GRAPH = _async_graph()


def test_an_engine_run_thread_is_stored_as_the_saver_stores_one(orders_fake):
    """The steps the workers run hold the serialized checkpoint in `Step.checkpoint`, the
    saver's record, not in the decision: LangGraph lists the thread through the saver, and
    an application goes on with it through the saver."""
    orders_fake.push(completion(tool_calls=[tool_call("lookup_order", {"order_id": "9"})]))
    orders_fake.push(completion("Order 9 shipped."))
    run = services.start_run(
        "langgraph",
        {
            "graph": ORDERS,
            "thread_id": "stored-9",
            "input": {"messages": [{"type": "human", "content": "Where is order 9?"}]},
        },
    )
    run = drive(run)
    assert run.status == "succeeded", run.error
    steps = list(Step.objects.filter(run=run).order_by("number"))
    for step in steps:
        assert "langgraph_serialized" not in step.decision
        assert set(step.checkpoint) == {"checkpoint", "metadata", "blobs", "blob_at", "writes"}
        assert step.decision["langgraph"]["written"], step.number
    # Each value is stored by the step that wrote its version, and pointed at after.
    assert steps[-1].checkpoint["blob_at"]["messages"] == steps[-1].number
    assert steps[2].checkpoint["blobs"]["messages"][0] == "full"

    saver = AgentrunSaver()
    history = list(saver.list({"configurable": {"thread_id": "stored-9"}}))
    ids = [s.decision["langgraph"]["checkpoint_id"] for s in reversed(steps)]
    assert [t.config["configurable"]["checkpoint_id"] for t in history] == ids
    for found, step in zip(history, reversed(steps), strict=True):
        post = snapshots.load(run.pk, step.number, "post")
        assert plain(found.checkpoint["channel_values"]) == post
        parent = step.decision["langgraph"]["parent_checkpoint_id"]
        assert (found.parent_config or {}).get("configurable", {}).get("checkpoint_id") == parent

    # A LangGraph application goes on with the thread the workers ran.
    from langchain_core.messages import HumanMessage

    from tests.langgraph.orders_graph import build_graph

    orders_fake.push(completion("You're welcome."))
    app = build_graph(orders_fake.base_url, AgentrunSaver())
    config = {"configurable": {"thread_id": "stored-9"}}
    result = app.invoke({"messages": [HumanMessage("Thanks!")]}, config)
    assert [m.content for m in result["messages"]][-3:] == [
        "Order 9 shipped.",
        "Thanks!",
        "You're welcome.",
    ]
    assert Step.objects.filter(run=run).count() > len(steps)


def test_a_step_retried_after_its_decision_was_stored_reads_its_checkpoint_back(
    orders_fake, monkeypatch
):
    """A step that stops after its decision (and checkpoint record) are stored is retried
    with that decision, not decided again, and commits from the stored record."""
    from agentrun.engine import step as engine_step

    orders_fake.push(completion("No tool needed."))
    real_calls_of = engine_step.calls_of
    stopped = []

    def stop_once(ctx, decision):
        if not stopped and ctx.step.number == 3:
            stopped.append(ctx.step.number)
            raise RuntimeError("the worker stopped after the decision was stored")
        return real_calls_of(ctx, decision)

    monkeypatch.setattr(engine_step, "calls_of", stop_once)
    run = services.start_run(
        "langgraph",
        {
            "graph": ORDERS,
            "thread_id": "retried-1",
            "input": {"messages": [{"type": "human", "content": "Hello"}]},
        },
    )
    with pytest.raises(RuntimeError, match="after the decision was stored"):
        drive(run)  # the step's exception escapes, as from a worker's task
    assert stopped == [3]
    run = drive(run, through_backoff=True)
    assert run.status == "succeeded", run.error
    step = Step.objects.get(run=run, number=3)
    assert step.crashes == 1 and step.decision_count == 1
    assert step.decision["langgraph"]["nodes"] == ["agent"]
    assert len(orders_fake.chat_requests()) == 1
    state = orders_graph_state("retried-1")
    assert state.values["messages"][-1].content == "No tool needed."
