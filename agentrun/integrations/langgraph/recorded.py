"""Model and tool calls of a LangGraph fork answered from its parent's record.

LangGraph re-executes a graph's nodes when it goes on from a checkpoint: a fork would
ask its model again and run its tools again. A graph that wraps them,

    model = recorded_model(ChatOpenAI(...).bind_tools(tools))
    tool_node = ToolNode([recorded_tool(t) for t in tools])

gets agentrun's fork modes (DESIGN section 6) when agentrun's workers execute it:

- `recorded`: while the fork's state is the parent's at the same step (equal pre
  snapshot hashes), the model's answer is the message the parent's model gave at that
  step, not a new request. The first step where the states differ is the run's
  divergence; from there on the fork goes on as in sandbox.
- `sandbox` (and `recorded` past its divergence): the model is asked; a tool is not
  run, it answers with the parent's result for the same call (same tool, same
  arguments) or, when the parent has none, with a message saying it was skipped. A tool
  wrapped with `kind="read"` (no side effects) runs in sandbox too, as agentrun's read
  tools do.
- `live`, and every run that is not a fork of this kind: the wrapped model and tools
  are called as they are. Outside agentrun's workers the wrappers change nothing.
"""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import run_in_executor
from langchain_core.tools import BaseTool

#: What the tool answers in a sandbox when the parent has no result for the same call.
SKIPPED = "skipped in sandbox: {tool} was not run (the parent has no result for this call)"

_current: contextvars.ContextVar[_Replay | None] = contextvars.ContextVar(
    "agentrun_langgraph_replay", default=None
)


class _Replay:
    """What one step of a fork may answer from its parent's record, read before the
    graph runs: the graph's nodes run on LangGraph's threads, which touch no database."""

    def __init__(self, run: Any, step: int, recorded: bool, parent_thread: str) -> None:
        self.run, self.step = run, step
        self.recorded = recorded  # answering models from the record (not diverged)
        self.parent_thread = parent_thread
        self.diverged: str | None = None  # why, when this step diverged
        self._lock = threading.Lock()
        self._answers: list[AIMessage] = []
        self._results: dict[tuple[str, str], ToolMessage] = {}

    def load(self) -> None:
        if self.recorded:
            self._answers = _parent_answers(self.run.parent_id, self.parent_thread, self.step)
        self._results = _parent_results(self.parent_thread)

    def model_answer(self) -> AIMessage | None:
        """The next message the parent's model gave at this step, if any is left."""
        with self._lock:
            return self._answers.pop(0) if self._answers else None

    def tool_result(self, name: str, args: Any) -> ToolMessage | None:
        """The parent's tool message for the same call, or None."""
        return self._results.get((name, _key(args)))

    def diverge(self, reason: str) -> None:
        """From here on, the fork is not the parent's: noted now, stored by `answering`."""
        with self._lock:
            self.recorded = False
            self.diverged = self.diverged or reason


@contextmanager
def answering(run: Any, step: int) -> Iterator[None]:
    """The fork modes for the graph's wrapped model and tool calls during one step; the
    step's divergence, if it diverged, is on record when the step's super-step is done."""
    replay = _replay_for(run, step)
    if replay is not None:
        replay.load()
    token = _current.set(replay)
    try:
        yield
    finally:
        _current.reset(token)
    if replay is not None and replay.diverged:
        _mark_divergence(run, step, replay.diverged)


def _mark_divergence(run: Any, step: int, reason: str) -> None:
    """The fork's first step whose state is not the parent's: on record, once."""
    from agentrun.audit.events import record_event
    from agentrun.models import Run

    with transaction.atomic():
        marked = Run.objects.filter(pk=run.pk, divergence_step__isnull=True).update(
            divergence_step=step
        )
        if marked:
            record_event("diverged", run=run, step=step, payload={"reason": reason})


def _replay_for(run: Any, step: int) -> _Replay | None:
    from agentrun.models import ReplayMode, Run, Snapshot

    if run.mode not in (ReplayMode.SANDBOX, ReplayMode.RECORDED) or run.parent_id is None:
        return None
    parent = Run.objects.filter(pk=run.parent_id).values_list("input", flat=True).first() or {}
    recorded = run.mode == ReplayMode.RECORDED and run.divergence_step is None
    replay = _Replay(run, step, recorded, str(parent.get("thread_id", "")))
    if recorded:
        seq = Snapshot.seq_for(step, "pre")
        mine = Snapshot.objects.filter(run=run, seq=seq).values_list("hash", flat=True).first()
        theirs = (
            Snapshot.objects.filter(run_id=run.parent_id, seq=seq)
            .values_list("hash", flat=True)
            .first()
        )
        if theirs is None or mine != theirs:
            replay.diverge(
                "the parent has no step here"
                if theirs is None
                else "the state differs from the parent's"
            )
    return replay


def _key(args: Any) -> str:
    return json.dumps(args, sort_keys=True, default=str)


def _parent_answers(parent_id: Any, thread: str, step: int) -> list[AIMessage]:
    """The AI messages the parent's step `step` added to its channels, in order."""
    from agentrun.integrations.langgraph.saver import AgentrunSaver
    from agentrun.models import Step

    rows = Step.objects.filter(run_id=parent_id, number__in=(step - 1, step))
    decisions = dict(rows.values_list("number", "decision"))
    at = (decisions.get(step) or {}).get("langgraph")
    if not at:
        return []
    saver = AgentrunSaver()
    after = saver.get_tuple(_at(thread, at["checkpoint_id"]))
    before = (
        saver.get_tuple(_at(thread, at["parent_checkpoint_id"]))
        if at.get("parent_checkpoint_id")
        else None
    )
    if after is None:
        return []
    seen_ids = {
        m.id
        for m in _messages(before.checkpoint.get("channel_values", {}) if before else {})
        if m.id is not None
    }
    return [
        m
        for m in _messages(after.checkpoint.get("channel_values", {}))
        if isinstance(m, AIMessage) and (m.id is None or m.id not in seen_ids)
    ]


def _parent_results(thread: str) -> dict[tuple[str, str], ToolMessage]:
    """The parent thread's tool messages, by (tool, arguments): its latest checkpoint's."""
    from agentrun.integrations.langgraph.saver import AgentrunSaver

    latest = AgentrunSaver().get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    if latest is None:
        return {}
    messages = _messages(latest.checkpoint.get("channel_values", {}))
    calls = {
        call["id"]: (call["name"], _key(call.get("args", {})))
        for m in messages
        if isinstance(m, AIMessage)
        for call in m.tool_calls
    }
    return {
        calls[m.tool_call_id]: m
        for m in messages
        if isinstance(m, ToolMessage) and m.tool_call_id in calls
    }


def _messages(values: dict[str, Any]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for value in values.values():
        if isinstance(value, list):
            out.extend(v for v in value if isinstance(v, BaseMessage))
    return out


def _at(thread: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    }


class _RecordedModel(Runnable):
    """A chat model (or any runnable answering with a message) that a recorded fork's
    step answers from the parent's record."""

    def __init__(self, bound: Runnable) -> None:
        self.bound = bound

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        answer = _recorded_answer()
        return answer if answer is not None else self.bound.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        answer = _recorded_answer()
        if answer is not None:
            return answer
        return await self.bound.ainvoke(input, config, **kwargs)


def _recorded_answer() -> AIMessage | None:
    replay = _current.get()
    if replay is None or not replay.recorded:
        return None
    answer = replay.model_answer()
    if answer is None:
        replay.diverge("the parent's model gave no more answers at this step")
    return answer


def recorded_model(model: Runnable) -> Runnable:
    """`model` (a chat model, e.g. after bind_tools) answering a recorded fork's steps
    from the parent's record; elsewhere it is `model`."""
    return _RecordedModel(model)


class _RecordedTool(BaseTool):
    """A tool that a sandbox or recorded fork's step does not run (see recorded_tool)."""

    tool: BaseTool
    kind: str = "write"

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        replay = _current.get()
        if replay is None or self.kind == "read":
            return self.tool.invoke(input, config, **kwargs)
        call = input if isinstance(input, dict) and input.get("type") == "tool_call" else None
        found = replay.tool_result(self.name, call["args"] if call else input)
        if call is None:
            return SKIPPED.format(tool=self.name) if found is None else found.content
        if found is not None and found.tool_call_id == call["id"]:
            return found  # the parent's message itself: the same state as the parent's
        content = SKIPPED.format(tool=self.name) if found is None else found.content
        return ToolMessage(content=content, tool_call_id=call["id"], name=self.name)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if _current.get() is None or self.kind == "read":
            return await self.tool.ainvoke(input, config, **kwargs)
        return await run_in_executor(None, self.invoke, input, config, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # invoke never gets here
        raise NotImplementedError


def recorded_tool(tool: BaseTool, *, kind: str = "write") -> BaseTool:
    """`tool`, which a sandbox or recorded fork does not run (unless `kind="read"`): it
    answers with the parent's result for the same call, else says it was skipped."""
    if kind not in ("read", "write"):
        raise ValueError('kind must be "read" or "write"')
    return _RecordedTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        tool=tool,
        kind=kind,
    )
