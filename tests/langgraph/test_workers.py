"""Registered LangGraph graphs executed by real Celery worker processes: a fork from the
API with an edited message, and a worker killed in the middle of a super-step."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from django.test import Client  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, driven, run_id_for  # noqa: E402
from agentrun.lifecycle import services  # noqa: E402
from agentrun.models import ApiToken, Run, Step  # noqa: E402
from agentrun.store import snapshots  # noqa: E402
from tests.base import make_people  # noqa: E402
from tests.fake_openai import completion  # noqa: E402
from tests.langgraph.conftest import ORDERS  # noqa: E402
from tests.workers import wait_until  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

SLOW = "tests.langgraph.slow_graph:graph"


def _ended(run: Run):
    def check():
        run.refresh_from_db()
        return run.status in ("succeeded", "failed", "cancelled", "waiting") and run

    return check


def _pid(step: Step) -> int:
    return int(step.worker.split(":")[1])  # a lease owner is host:pid:nonce


def test_a_fork_from_the_api_runs_in_a_worker_and_diverges(ran_orders, orders_fake, start_worker):
    worker = start_worker(
        AGENTRUN_LANGGRAPH_GRAPHS=ORDERS, ORDERS_GRAPH_OPENAI_URL=orders_fake.base_url
    )
    parent = Run.objects.get(pk=run_id_for("order-42"))
    state = snapshots.load(parent.pk, 4, "post")
    state["messages"][2]["content"] = "order 42: lost in transit"
    orders_fake.push(completion("Order 42 was lost; we are sending another."))
    operator = make_people()["operator"]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(operator)}")
    made = api.post(
        f"/api/runs/{parent.pk}/fork",
        {"step": 4, "at": "post", "state": state, "mode": "live", "reason": "lost parcel"},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    fork = Run.objects.get(pk=made.json()["id"])
    wait_until(_ended(fork), timeout=60, what="the fork to finish")
    assert fork.status == "succeeded", (fork.error, worker.text()[-3000:])
    assert fork.parent_id == parent.pk
    assert fork.final_answer == "Order 42 was lost; we are sending another."
    steps = list(Step.objects.filter(run=fork).order_by("number"))
    assert [s.number for s in steps] == [5]
    # Executed by the worker process, not by this (web) process.
    assert {_pid(s) for s in steps} == {worker.proc.pid}
    assert orders_fake.chat_requests()[-1].json["messages"][-1]["content"] == (
        "order 42: lost in transit"
    )
    # The compare page of parent and fork: the first divergence is the fork's first step.
    page = Client()
    page.force_login(operator)
    html = page.get(f"/runs/{fork.pk}/compare/").content.decode()
    assert "first divergence" in html
    from debugger.compare import align

    assert align(parent, fork).first_divergence == 5


def test_a_worker_killed_mid_super_step_resumes_from_the_last_checkpoint(
    start_worker, settings, tmp_path
):
    """The run's third step is the slow node's super-step: its worker is SIGKILLed while
    the node sleeps, and another worker runs that super-step again from the committed
    checkpoint; the steps before it are not executed again."""
    marks = tmp_path / "marks"
    marks.touch()
    env = {"AGENTRUN_LANGGRAPH_GRAPHS": SLOW, "SLOW_GRAPH_MARKS": str(marks)}
    settings.AGENTRUN_LANGGRAPH_GRAPHS = [SLOW]
    driven._graphs.clear()
    first = start_worker(beat=True, SLOW_GRAPH_SECONDS="30", **env)
    run = services.start_run("langgraph", {"graph": SLOW, "thread_id": "slow-1", "input": {}})
    wait_until(lambda: "slow" in marks.read_text(), timeout=60, what="the slow node to start")
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    second = start_worker(beat=True, SLOW_GRAPH_SECONDS="0", **env)
    wait_until(_ended(run), timeout=90, what="the run to finish")
    assert run.status == "succeeded", (run.error, second.text()[-3000:])
    ran = [line.split() for line in marks.read_text().splitlines()]
    assert [node for node, _pid in ran] == ["prepare", "slow", "slow", "finish"]
    assert {int(p) for node, p in ran if node == "prepare"} == {first.proc.pid}
    assert {int(p) for node, p in ran if node == "finish"} == {second.proc.pid}
    steps = {s.number: s for s in Step.objects.filter(run=run)}
    slow_step = next(s for s in steps.values() if s.decision["langgraph"]["nodes"] == ["slow"])
    assert (slow_step.attempts, slow_step.crashes) == (2, 1)
    assert str(first.proc.pid) in slow_step.crash_log[0]["worker"]
    assert all(s.decision_count == 1 for s in steps.values())
    assert all(s.attempts == 1 for s in steps.values() if s is not slow_step)
    # The killed attempt left nothing: the slow node's write is in the thread once.
    graph = driven.graph_named(SLOW).copy(update={"checkpointer": AgentrunSaver()})
    state = graph.get_state({"configurable": {"thread_id": "slow-1"}})
    assert state.values["log"] == ["prepared", "slow done", "finished"]
    assert state.next == ()
