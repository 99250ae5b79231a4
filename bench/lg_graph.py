"""The LangGraph agent the saver's benches run: a tool-calling agent that looks orders up,
one message a super-step. No environment of its own: its importer sets Django up."""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up by its id: its status, carrier and items."""
    n = int(order_id)
    return json.dumps(
        {
            "order_id": order_id,
            "status": ("shipped", "packed", "delayed")[n % 3],
            "carrier": "UPS",
            "tracking": f"1Z999AA1{n:010d}",
            "eta": f"2026-05-{n % 28 + 1:02d}",
            "items": [
                {"sku": f"SKU-{n % 97:03d}", "name": "Espresso cups, set of 4", "qty": 1},
                {"sku": f"SKU-{n % 89:03d}", "name": "Milk frother", "qty": 2},
            ],
        }
    )


class State(TypedDict):
    messages: Annotated[list, add_messages]


def build(steps: int, checkpointer: Any) -> Any:
    """The agent graph: `steps` super-steps (the input's included), one message each."""

    def model(state: State) -> dict[str, Any]:
        n = len(state["messages"])
        if n >= steps - 1:
            return {"messages": [AIMessage("All the orders are checked: none is lost.")]}
        return {
            "messages": [
                AIMessage(
                    f"Order {n} is next. The customer asked about it in their last message, "
                    "so I look it up before I answer.",
                    tool_calls=[
                        {"name": "lookup_order", "args": {"order_id": str(n)}, "id": f"call_{n}"}
                    ],
                )
            ]
        }

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([lookup_order]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)
