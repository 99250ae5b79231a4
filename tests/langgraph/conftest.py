"""The LangGraph tests' fixtures: the debugger's logins, and a graph run once."""

import pytest
from langchain_core.messages import HumanMessage

from agentrun.integrations.langgraph import AgentrunSaver
from tests.debugger.conftest import client_for, people  # noqa: F401 - the debugger's logins
from tests.fake_openai import FakeOpenAI, completion, tool_call
from tests.langgraph.orders_graph import build_graph


@pytest.fixture
def ran():
    """The graph run once on thread `order-42`: a tool call, its result, the answer."""
    saver = AgentrunSaver()
    with FakeOpenAI() as fake:
        fake.push(completion(tool_calls=[tool_call("lookup_order", {"order_id": "42"})]))
        fake.push(completion("Your order 42 shipped on May 2."))
        graph = build_graph(fake.base_url, saver)
        config = {
            "configurable": {"thread_id": "order-42"},
            "metadata": {"customer": "acme", "channel": "chat"},
        }
        result = graph.invoke({"messages": [HumanMessage("Where is order 42?")]}, config)
        assert len(fake.chat_requests()) == 2
    return graph, config, result
