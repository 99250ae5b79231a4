"""A LangGraph agent graph of the kind a LangGraph user writes, checkpointed by agentrun:
a model node (LangChain's ChatOpenAI) that may call a tool, and a tool node."""

from __future__ import annotations

import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agentrun.integrations.langgraph import AgentrunSaver, recorded_model, recorded_tool


@tool
def lookup_order(order_id: str) -> str:
    """The status of an order."""
    return f"order {order_id}: shipped on May 2"


def build_graph(base_url: str, saver: AgentrunSaver | None = None):
    model = ChatOpenAI(model="fake-model", base_url=base_url, api_key="sk-test", max_retries=0)
    # Wrapped, so a sandbox or recorded fork answers from the parent's record.
    model = recorded_model(model.bind_tools([lookup_order]))

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([recorded_tool(lookup_order)]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver or AgentrunSaver())


#: The graph as agentrun's workers load it (AGENTRUN_LANGGRAPH_GRAPHS names
#: `tests.langgraph.orders_graph:graph`), its model at the URL the tests' fake serves.
graph = build_graph(os.environ.get("ORDERS_GRAPH_OPENAI_URL", "http://127.0.0.1:9/v1"))
