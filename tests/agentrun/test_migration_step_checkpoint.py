"""Migration 0023 moves a LangGraph step's serialized checkpoint from its decision into the
compressed `checkpoint` column, and back: the saver reads the same thread either way."""

import base64

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.models import Step  # noqa: E402
from tests.agentrun.migrating import leaves, migrate  # noqa: E402
from tests.langgraph.conftest import orders_fake  # noqa: E402, F401 - the fixture
from tests.langgraph.test_saver import _grow  # noqa: E402

BEFORE = [("agentrun", "0022_step_trace_due")]
AFTER = [("agentrun", "0023_step_checkpoint")]


@pytest.mark.django_db(transaction=True)
def test_a_thread_reads_back_the_same_after_undoing_the_migration_and_doing_it_again():
    latest = leaves()
    saver = AgentrunSaver()
    stored = _grow(saver, "moved", 40)
    config = stored[-1][0]
    saver.put_writes(config, [("messages", [AIMessage("pending", id="p")])], "task-1")
    before = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config)]
    try:
        old = migrate(BEFORE)
        steps = old.get_model("agentrun", "Step").objects.filter(run_id=run_id_for("moved"))
        last = steps.order_by("-number").first().decision
        serialized = last["langgraph_serialized"]  # the form the saver used to write
        kind, data = serialized["blobs"]["messages"]
        assert kind == "msgpack"
        assert saver.serde.loads_typed((kind, base64.b64decode(data))) == stored[-1][1]
        assert serialized["written"] == {"messages": 40, "count": 40}
        assert "written" not in last["langgraph"]
        migrate(AFTER)
        step = Step.objects.get(run_id=run_id_for("moved"), number=40)
        assert "langgraph_serialized" not in step.decision
        assert step.decision["langgraph"]["written"] == {"messages": 40, "count": 40}
        assert step.checkpoint["blobs"]["messages"][0] == "full"
        reader = AgentrunSaver()
        after = [(t.checkpoint, t.metadata, t.pending_writes) for t in reader.list(config)]
        assert after == before
        assert reader.get_tuple(config).pending_writes == before[0][2]
    finally:
        migrate(latest)


@pytest.mark.django_db(transaction=True)
def test_a_thread_agentruns_workers_ran_converts_both_ways_too(orders_fake):  # noqa: F811
    """The steps the engine ran (a registered graph, one super-step a step) kept the same
    `langgraph_serialized` form in their decisions: they move, and back, the same way."""
    from agentrun.lifecycle import services
    from tests.base import drive
    from tests.fake_openai import completion
    from tests.langgraph.conftest import ORDERS

    latest = leaves()
    orders_fake.push(completion("Order 5 shipped."))
    run = services.start_run(
        "langgraph",
        {
            "graph": ORDERS,
            "thread_id": "engine-moved",
            "input": {"messages": [{"type": "human", "content": "Where is order 5?"}]},
        },
    )
    assert drive(run).status == "succeeded"
    config = {"configurable": {"thread_id": "engine-moved"}}
    before = [(t.checkpoint, t.metadata) for t in AgentrunSaver().list(config)]
    records = dict(Step.objects.filter(run=run).values_list("number", "checkpoint"))
    try:
        old = migrate(BEFORE)
        steps = old.get_model("agentrun", "Step").objects.filter(run_id=run.pk)
        for step in steps:
            serialized = step.decision["langgraph_serialized"]
            assert serialized["blob_at"] == records[step.number]["blob_at"]
            assert "written" not in step.decision["langgraph"]
        migrate(AFTER)
        after = [(t.checkpoint, t.metadata) for t in AgentrunSaver().list(config)]
        assert after == before
        moved = dict(Step.objects.filter(run=run).values_list("number", "checkpoint"))
        assert moved == records
    finally:
        migrate(latest)
