"""LangGraph calls the saver from threads of its own, which nothing closes Django's
connection on: the saver does that work on a thread of its own, which hands its connection
back once idle, and the connections of a process stay as many however many graphs run."""

from __future__ import annotations

import asyncio
import gc
import os
import time
import uuid
from typing import Annotated, TypedDict

import pytest

pytest.importorskip("langgraph")

from django.db import connection  # noqa: E402
from langgraph.graph import START, StateGraph  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver  # noqa: E402
from agentrun.integrations.langgraph.saver import _DatabaseThread  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


class State(TypedDict):
    seen: Annotated[list, lambda a, b: a + b]


def graph(saver: AgentrunSaver):
    builder = StateGraph(State)
    builder.add_node("first", lambda s: {"seen": ["first"]})
    builder.add_node("second", lambda s: {"seen": ["second"]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    return builder.compile(checkpointer=saver)


def run_threads(count: int) -> None:
    """Threads run with the saver, synchronously (LangGraph's background executor) and
    asynchronously (asgiref's thread), each a new thread of LangGraph's."""
    saver = AgentrunSaver()
    for n in range(count):
        config = {"configurable": {"thread_id": f"conn-{n}-{uuid.uuid4()}"}}
        assert graph(saver).invoke({"seen": []}, config)["seen"] == ["first", "second"]
        config = {"configurable": {"thread_id": f"conn-async-{n}-{uuid.uuid4()}"}}
        result = asyncio.run(graph(saver).ainvoke({"seen": []}, config))
        assert result["seen"] == ["first", "second"]
    connection.close()
    time.sleep(_DatabaseThread.IDLE + 0.5)  # the saver's thread gives its connection back


def sqlite_connections() -> int:
    """This process's open files that are the SQLite database."""
    path = os.path.realpath(connection.settings_dict["NAME"])
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _target(fd) == path)


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def checked_out() -> int:
    """The pool's connections out of it now: the fewest of a few looks, so that a
    connection another thread of the process holds for a moment does not count."""
    seen = []
    for _ in range(5):
        stats = connection.pool.get_stats()
        seen.append(stats["pool_size"] - stats.get("pool_available", 0))
        time.sleep(0.05)
    return min(seen)


def test_langgraphs_threads_hand_pooled_connections_back():
    if getattr(connection, "pool", None) is None:
        pytest.skip("a connection pool: PostgreSQL")
    connection.close()  # this thread's, as run_threads leaves it
    before = checked_out()  # what the process holds already (the suite's other threads)
    run_threads(5)
    assert checked_out() <= before, connection.pool.get_stats()


def test_the_sqlite_connections_of_langgraphs_threads_end_with_them():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite")
    run_threads(3)
    gc.collect()
    before = sqlite_connections()
    run_threads(10)
    gc.collect()
    assert sqlite_connections() <= before
