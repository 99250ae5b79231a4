"""A registered graph with a slow middle node, for killing a worker mid super-step:
each node notes that it ran in the file SLOW_GRAPH_MARKS names (the test counts them)."""

from __future__ import annotations

import operator
import os
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from agentrun.integrations.langgraph import AgentrunSaver


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _mark(node: str) -> None:
    path = os.environ.get("SLOW_GRAPH_MARKS")
    if path:
        with open(path, "a") as f:
            f.write(f"{node} {os.getpid()}\n")


def prepare(state: Log) -> dict:
    _mark("prepare")
    return {"log": ["prepared"]}


def slow(state: Log) -> dict:
    _mark("slow")
    time.sleep(float(os.environ.get("SLOW_GRAPH_SECONDS", "0")))
    return {"log": ["slow done"]}


def finish(state: Log) -> dict:
    _mark("finish")
    return {"log": ["finished"]}


builder = StateGraph(Log)
builder.add_node("prepare", prepare)
builder.add_node("slow", slow)
builder.add_node("finish", finish)
builder.add_edge(START, "prepare")
builder.add_edge("prepare", "slow")
builder.add_edge("slow", "finish")
builder.add_edge("finish", END)
graph = builder.compile(checkpointer=AgentrunSaver())
