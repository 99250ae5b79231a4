"""What the conformance suite doesn't ask: the order LangGraph really writes in, the
plain JSON the debugger gets, the step numbers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.integrations.langgraph.plain import plain  # noqa: E402
from agentrun.models import Step  # noqa: E402
from agentrun.store import checkpoints, snapshots  # noqa: E402

pytestmark = pytest.mark.django_db


def checkpoint(values: dict, versions: dict) -> dict:
    cp = empty_checkpoint()
    cp["id"] = str(uuid6(clock_seq=-1))
    cp["channel_values"] = values
    cp["channel_versions"] = versions
    return cp


def test_writes_that_come_before_their_checkpoint_wait_for_it():
    """LangGraph puts a checkpoint in the background while the tasks it started already
    write: the writes wait, and the steps stay numbered in checkpoint order."""
    saver = AgentrunSaver()
    config = {"configurable": {"thread_id": "early", "checkpoint_ns": ""}}
    first = saver.put(
        config, checkpoint({"n": 1}, {"n": 1}), {"source": "input", "step": -1}, {"n": 1}
    )
    second = checkpoint({"n": 2}, {"n": 2})
    second_config = {"configurable": {**config["configurable"], "checkpoint_id": second["id"]}}
    saver.put_writes(second_config, [("n", 3)], "task-1")
    third = checkpoint({"n": 3}, {"n": 3})
    third_config = {"configurable": {**config["configurable"], "checkpoint_id": third["id"]}}
    saver.put_writes(third_config, [("n", 4)], "task-2")  # two checkpoints waiting
    assert saver.get_tuple(second_config) is None  # not put yet
    assert saver.get_tuple(config).config == first
    stored = saver.put(first, second, {"source": "loop", "step": 0}, {"n": 2})
    tup = saver.get_tuple(stored)
    assert tup.pending_writes == [("task-1", "n", 3)]
    assert tup.checkpoint["channel_values"] == {"n": 2}
    steps = Step.objects.filter(run_id=run_id_for("early")).order_by("number")
    assert [s.number for s in steps] == [-1, 1, 2]  # the third's writes still wait
    saver.put(stored, third, {"source": "loop", "step": 1}, {"n": 3})
    assert saver.get_tuple(third_config).pending_writes == [("task-2", "n", 4)]
    assert [s.number for s in steps.all()] == [1, 2, 3]
    assert steps[2].decision["langgraph"]["writes"][0]["value"] == 3


def test_messages_are_plain_json_in_the_snapshots_and_objects_for_langgraph():
    saver = AgentrunSaver()
    config = {"configurable": {"thread_id": "msgs", "checkpoint_ns": ""}}
    message = AIMessage(
        "hello", id="m1", tool_calls=[{"name": "f", "args": {"x": b"\x00"}, "id": "c1"}]
    )
    stored = saver.put(
        config, checkpoint({"messages": [message]}, {"messages": 1}), {"step": 0}, {"messages": 1}
    )
    post = snapshots.load(run_id_for("msgs"), 1, "post")
    shown = post["messages"][0]
    assert shown["type"] == "ai" and shown["content"] == "hello" and shown["id"] == "m1"
    assert shown["tool_calls"][0]["args"] == {"x": {"base64": "AA=="}}
    assert saver.get_tuple(stored).checkpoint["channel_values"]["messages"] == [message]


def test_plain_shows_what_json_cannot_hold():
    assert plain({1: {"a", "b"}, "t": (1, float("nan"))}) == {"1": ["a", "b"], "t": [1, "nan"]}


def _grow(saver, thread, n, start=None):
    """n checkpoints of a thread whose `messages` list grows by one message a step."""
    config = start or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    messages = []
    stored = []
    for i in range(n):
        messages = [*messages, AIMessage(f"message {i} " + "words " * 20, id=f"m{i}")]
        cp = checkpoint({"messages": messages, "count": i}, {"messages": i + 1, "count": i + 1})
        config = saver.put(
            config, cp, {"source": "loop", "step": i}, {"messages": i + 1, "count": i + 1}
        )
        stored.append((config, list(messages)))
    return stored


def test_a_growing_list_is_stored_as_its_new_items_and_read_back_whole():
    saver = AgentrunSaver()
    n = 2 * checkpoints.CHAIN + 5
    stored = _grow(saver, "growing", n)
    records = dict(
        Step.objects.filter(run_id=run_id_for("growing")).values_list("number", "checkpoint")
    )
    forms = [records[k]["blobs"]["messages"][0] for k in sorted(records)]
    assert forms.count("full") == 3 and forms.count("ext") == n - 3
    assert len(json.dumps(records[n]["blobs"]["messages"])) < 1000  # one message, not n
    # The snapshots' plain values, built from the previous step's and the new items, are
    # the values' own.
    for k in (1, 2, checkpoints.CHAIN, n):
        post = snapshots.load(run_id_for("growing"), k, "post")
        assert post == {"messages": plain(stored[k - 1][1]), "count": k - 1}
    # Read by a saver that didn't write them (no cache), one checkpoint at a time...
    reader = AgentrunSaver()
    for config, messages in stored:
        assert reader.get_tuple(config).checkpoint["channel_values"]["messages"] == messages
    # ...and the whole history at once, each value a list of its own.
    history = list(reader.list({"configurable": {"thread_id": "growing"}}))
    assert [t.checkpoint["channel_values"]["messages"] for t in history] == [
        m for _c, m in reversed(stored)
    ]
    history[0].checkpoint["channel_values"]["messages"].append("mine")
    assert len(history[1].checkpoint["channel_values"]["messages"]) == n - 1


def test_a_list_that_is_rewritten_or_branched_is_stored_whole():
    saver = AgentrunSaver()
    stored = _grow(saver, "rewritten", 3)
    config, messages = stored[-1]
    edited = [AIMessage("other", id="x"), *messages[1:]]
    cp = checkpoint({"messages": edited, "count": 9}, {"messages": 9, "count": 9})
    edited_config = saver.put(config, cp, {"step": 3}, {"messages": 9})
    branch = _grow(saver, "rewritten", 2, start=stored[0][0])  # from the first checkpoint
    blobs = [
        r["blobs"]["messages"][0]
        for r in Step.objects.filter(run_id=run_id_for("rewritten"))
        .order_by("number")
        .values_list("checkpoint", flat=True)
    ]
    assert blobs == ["full", "ext", "ext", "full", "full", "ext"]
    assert saver.get_tuple(edited_config).checkpoint["channel_values"]["messages"] == edited
    for config, messages in branch:
        assert saver.get_tuple(config).checkpoint["channel_values"]["messages"] == messages


def test_two_savers_writing_one_thread_number_its_steps_in_order():
    """A saver puts a checkpoint after its own last one without reading first: when
    another saver (another process) put one in between, the run's next step number has
    moved, the write is refused and the checkpoint is put the careful way."""
    first, second = AgentrunSaver(), AgentrunSaver()
    one = _grow(first, "shared", 2)
    parent_config, messages = one[-1]
    # The other saver continues the thread...
    more = [*messages, AIMessage("from the second saver", id="s")]
    cp = checkpoint({"messages": more, "count": 5}, {"messages": 5, "count": 5})
    second.put(parent_config, cp, {"step": 2}, {"messages": 5, "count": 5})
    # ...and the first one branches from its own last checkpoint.
    other = [*messages, AIMessage("from the first saver", id="f")]
    cp = checkpoint({"messages": other, "count": 6}, {"messages": 6, "count": 6})
    branch = first.put(parent_config, cp, {"step": 2}, {"messages": 6, "count": 6})
    first.put_writes(branch, [("count", 7)], "task-1")
    steps = Step.objects.filter(run_id=run_id_for("shared")).order_by("number")
    assert [s.number for s in steps] == [1, 2, 3, 4]
    tup = AgentrunSaver().get_tuple(branch)
    assert tup.checkpoint["channel_values"]["messages"] == other
    assert tup.pending_writes == [("task-1", "count", 7)]
    assert snapshots.load(run_id_for("shared"), 4, "pre")["messages"] == plain(messages)
    assert snapshots.load(run_id_for("shared"), 4, "post")["messages"] == plain(other)
