"""A real LangGraph agent graph (a model node calling the local fake OpenAI server through
LangChain's ChatOpenAI, a tool node) run with the agentrun saver, then read back through
LangGraph and through the debugger's pages."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import ToolMessage  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.models import Run, Step  # noqa: E402
from agentrun.store import snapshots  # noqa: E402
from tests.langgraph.orders_graph import lookup_order  # noqa: E402

# The saver's puts may come from LangGraph's own threads (another database connection
# than the test's): a transactional test, so they see each other's commits.
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thread_is_a_run_and_each_super_step_a_step(ran):
    graph, config, result = ran
    assert result["messages"][-1].content == "Your order 42 shipped on May 2."
    run = Run.objects.get(pk=run_id_for("order-42"))
    assert run.agent == "langgraph"
    assert {label.key: label.value for label in run.labels.all()} == {
        "langgraph.thread": "order-42",
        "customer": "acme",
        "channel": "chat",
    }
    history = list(graph.get_state_history(config))  # newest first
    steps = list(Step.objects.filter(run=run).order_by("number"))
    assert len(steps) == len(history) == 5
    assert [s.decision["langgraph"]["checkpoint_id"] for s in steps] == [
        h.config["configurable"]["checkpoint_id"] for h in reversed(history)
    ]
    # The node that ran in each super-step, and the metadata, on the step.
    assert [s.decision["langgraph"]["nodes"] for s in steps] == [
        [],
        ["__start__"],
        ["agent"],
        ["tools"],
        ["agent"],
    ]
    assert [s.decision["langgraph"]["step"] for s in steps] == [-1, 0, 1, 2, 3]
    assert steps[3].decision["thought"] == "LangGraph loop step 2: tools ran"
    assert steps[0].decision["langgraph"]["metadata"]["source"] == "input"
    # The channel values after the last super-step, as plain JSON in the delta store.
    final = snapshots.load(run.pk, 5, "post")
    kinds = [(m["type"], m.get("content")) for m in final["messages"]]
    assert kinds == [
        ("human", "Where is order 42?"),
        ("ai", None),
        ("tool", "order 42: shipped on May 2"),
        ("ai", "Your order 42 shipped on May 2."),
    ]
    # Each pre snapshot is the state after the step before.
    for step in steps[1:]:
        assert snapshots.load(run.pk, step.number, "pre") == snapshots.load(
            run.pk, step.number - 1, "post"
        )
    # LangGraph reads back its own objects.
    state = graph.get_state(config)
    assert isinstance(state.values["messages"][2], ToolMessage)
    assert state.values["messages"] == result["messages"]


def test_the_debugger_shows_the_tool_steps_diff(ran, client_for):
    run_id = run_id_for("order-42")
    client = client_for("viewer")
    page = client.get(f"/runs/{run_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "LangGraph loop step 2: tools ran" in html
    diff = client.get(f"/runs/{run_id}/steps/4/diff/")
    assert diff.status_code == 200
    text = diff.content.decode()
    assert "order 42: shipped on May 2" in text
    assert lookup_order.name in text  # the tool message names its tool
    step = client.get(f"/runs/{run_id}/steps/4/").content.decode()
    assert "LangGraph checkpoint" in step
    listed = client.get("/?label=customer=acme").content.decode()
    assert str(run_id)[:8] in listed


def test_an_interrupt_and_a_branch_show_on_the_steps():
    """update_state from an older checkpoint is a LangGraph branch: a step whose pre
    snapshot is that checkpoint's values; an interrupt is on the step it paused at."""
    from langgraph.types import interrupt

    def ask(state: MessagesState) -> dict:
        answer = interrupt("approve?")
        return {"messages": [("ai", f"approved: {answer}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    graph = builder.compile(checkpointer=AgentrunSaver())
    config = {"configurable": {"thread_id": "t-branch"}}
    graph.invoke({"messages": [("human", "hi")]}, config)
    run = Run.objects.get(pk=run_id_for("t-branch"))
    last = Step.objects.filter(run=run).order_by("-number").first()
    assert last.decision["langgraph"]["interrupts"], last.decision["langgraph"]
    assert "interrupted" in last.decision["thought"]
    assert json.dumps(last.decision["langgraph"]["interrupts"]).count("approve?") == 1

    first = list(graph.get_state_history(config))[-1]  # the input checkpoint
    graph.update_state(first.config, {"messages": [("human", "edited")]})
    branch = Step.objects.filter(run=run).order_by("-number").first()
    assert (
        branch.decision["langgraph"]["parent_checkpoint_id"]
        == (first.config["configurable"]["checkpoint_id"])
    )
    pre = snapshots.load(run.pk, branch.number, "pre")
    post = snapshots.load(run.pk, branch.number, "post")
    assert pre == snapshots.load(run.pk, 1, "post")
    assert [m["content"] for m in post["messages"]][-1] == "edited"


def test_a_langgraph_application_outside_django_gets_agentruns_settings(tmp_path):
    """The two-line change works in a plain Python process: importing the saver sets
    Django up with agentrun's settings, so the saver has agentrun's database."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(root)
    code = (
        "from agentrun.integrations.langgraph import AgentrunSaver\n"
        "from django.apps import apps\n"
        "from django.conf import settings\n"
        "print(apps.ready, settings.SETTINGS_MODULE, type(AgentrunSaver()).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "agentrun.settings", "AgentrunSaver"]


def test_a_subgraphs_namespace_is_a_child_run_of_the_thread():
    from typing import TypedDict

    class Text(TypedDict):
        text: str

    inner = StateGraph(Text)
    inner.add_node("shout", lambda s: {"text": s["text"].upper()})
    inner.add_edge(START, "shout")
    outer = StateGraph(Text)
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=AgentrunSaver())
    assert graph.invoke({"text": "hi"}, {"configurable": {"thread_id": "sub"}}) == {"text": "HI"}

    root = Run.objects.get(pk=run_id_for("sub"))
    child = Run.objects.get(
        agent="langgraph", input__thread_id="sub", input__thread_run=str(root.pk)
    )
    assert child.input["checkpoint_ns"].startswith("inner:")
    assert child.pk == run_id_for("sub", child.input["checkpoint_ns"])
    assert {label.key: label.value for label in child.labels.all()} == {
        "langgraph.thread": "sub",
        "langgraph.ns": "inner",
    }
    last = Step.objects.filter(run=child).order_by("-number").first()
    assert snapshots.load(child.pk, last.number, "post")["text"] == "HI"
    assert "shout" in last.decision["langgraph"]["nodes"]
