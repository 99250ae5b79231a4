"""Migration 0023 moves a LangGraph step's serialized checkpoint from its decision into the
compressed `checkpoint` column, and back: the saver reads the same thread either way."""

import base64

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.models import Step  # noqa: E402
from tests.langgraph.test_saver import _grow  # noqa: E402

BEFORE = [("agentrun", "0022_step_trace_due")]
AFTER = [("agentrun", "0023_step_checkpoint")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_a_thread_reads_back_the_same_after_undoing_the_migration_and_doing_it_again():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("agentrun")
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
