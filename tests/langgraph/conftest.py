"""The LangGraph tests' fixtures: the debugger's logins, and a graph run once."""

import pytest
from langchain_core.messages import HumanMessage

from agentrun.integrations.langgraph import AgentrunSaver
from tests.agentrun.conftest import start_worker  # noqa: F401 - real worker processes
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


#: The orders graph as AGENTRUN_LANGGRAPH_GRAPHS names it.
ORDERS = "tests.langgraph.orders_graph:graph"


@pytest.fixture
def orders_fake(settings, monkeypatch):
    """The local OpenAI fake, and the orders graph registered with its model there."""
    from agentrun.integrations.langgraph import driven

    with FakeOpenAI() as fake:
        monkeypatch.setenv("ORDERS_GRAPH_OPENAI_URL", fake.base_url)
        settings.AGENTRUN_LANGGRAPH_GRAPHS = [ORDERS]
        driven._graphs.clear()
        import importlib

        import tests.langgraph.orders_graph as module

        importlib.reload(module)
        yield fake
        driven._graphs.clear()


@pytest.fixture
def ran_orders(orders_fake):
    """The orders graph run once on thread `order-42` by a LangGraph application."""
    orders_fake.push(completion(tool_calls=[tool_call("lookup_order", {"order_id": "42"})]))
    orders_fake.push(completion("Your order 42 shipped on May 2."))
    graph = build_graph(orders_fake.base_url, AgentrunSaver())
    config = {"configurable": {"thread_id": "order-42"}}
    graph.invoke({"messages": [HumanMessage("Where is order 42?")]}, config)
    return graph, config
