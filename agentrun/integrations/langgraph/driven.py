"""LangGraph graphs executed by agentrun's workers, one super-step an agentrun step.

A graph named in AGENTRUN_LANGGRAPH_GRAPHS (`module:attribute` of a compiled graph) can
be run here: forked from a checkpoint of one of its threads, or started as a run. Such a
run is a thread like the saver's (agent `langgraph`, its id `run_id_for(thread id)`, each
checkpoint a step in the saver's format: the `langgraph` record in the decision, the
serialized one in `Step.checkpoint`, so LangGraph reads it with `AgentrunSaver`), but
its steps are the engine's: claimed with a lease, retried after a crash, committed with
a compare-and-set.

One step is one super-step: its decide seeds an in-memory checkpointer with the thread's
last committed checkpoint (a fork's first step: the parent's checkpoint, with the edits
applied by `update_state`), lets the graph run until it has written the next checkpoint,
and returns that checkpoint as the step's decision (its serialized record as the
decision's `checkpoint`); the engine stores both before the commit, so a retried step reuses it, and the commit's post snapshot is its channel
values. A worker that dies in a super-step leaves nothing of it: the step's next attempt
runs the super-step again from the committed checkpoint (its pre snapshot).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from importlib import import_module
from typing import Any

from django.conf import settings
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from agentrun.agents import Agent, AgentError, Decision, InvalidInput, register
from agentrun.engine import release_connection
from agentrun.integrations.langgraph import recorded
from agentrun.integrations.langgraph.plain import plain
from agentrun.integrations.langgraph.saver import (
    AGENT,
    THREAD_LABEL,
    AgentrunSaver,
    _interrupts,
    _packed,
    _summary,
    run_id_for,
)
from agentrun.models import Run, Step
from agentrun.security.redact import is_secret_key
from agentrun.store import checkpoints

#: A thread id's longest; a fork's thread is its parent's with a suffix.
MAX_THREAD_ID = 200

_graphs: dict[str, Any] = {}
_graphs_lock = threading.Lock()


def graph_named(name: Any) -> Any:
    """The compiled graph registered as `name` (its `module:attribute`); InvalidInput
    when it is not one of AGENTRUN_LANGGRAPH_GRAPHS."""
    names = settings.AGENTRUN_LANGGRAPH_GRAPHS
    if not isinstance(name, str) or name not in names:
        known = ", ".join(names) or "none"
        raise InvalidInput(
            f"graph {name!r} is not registered: AGENTRUN_LANGGRAPH_GRAPHS names {known}"
        )
    with _graphs_lock:
        if name not in _graphs:
            module, _, attribute = name.partition(":")
            try:
                graph = getattr(import_module(module), attribute)
            except (ImportError, AttributeError) as exc:
                raise InvalidInput(f"graph {name!r} can't be loaded: {exc}") from None
            if not hasattr(graph, "stream") or not hasattr(graph, "channels"):
                raise InvalidInput(f"{name!r} is not a compiled LangGraph graph")
            _graphs[name] = graph
        return _graphs[name]


def graph_for_channels(channels: set[str]) -> str:
    """The one registered graph whose channels hold a checkpoint's: a thread written by
    a LangGraph application doesn't say which graph wrote it."""
    fits = [
        n for n in settings.AGENTRUN_LANGGRAPH_GRAPHS if channels <= set(graph_named(n).channels)
    ]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ValueError(
            "no graph in AGENTRUN_LANGGRAPH_GRAPHS has this thread's channels "
            f"({', '.join(sorted(channels))}): register the graph that wrote it"
        )
    raise ValueError(f"several registered graphs fit this thread: {', '.join(fits)}")


class _Memory(InMemorySaver):
    """The super-step's checkpointer: in memory, numbering channel versions as the
    saver does (integers), so the thread goes on with either."""

    def get_next_version(self, current: Any, channel: Any) -> Any:
        return AgentrunSaver.get_next_version(self, current, channel)  # type: ignore[arg-type]


def _config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    conf = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def revive(original: Any, edited: Any) -> Any:
    """An edited plain value as LangGraph's objects again: the parts that were not edited
    are the original objects, an edited message or model is a copy with its edited
    fields; what has no original stays as it was written (a new message as a dict,
    which LangGraph's message reducer turns into a message)."""
    if plain(original) == edited:
        return original
    if isinstance(original, list | tuple) and isinstance(edited, list):
        out = [revive(o, e) for o, e in zip(original, edited, strict=False)]
        return out + list(edited[len(original) :])
    if isinstance(original, dict) and isinstance(edited, dict):
        return {k: revive(original.get(k), v) for k, v in edited.items()}
    if (
        isinstance(edited, dict)
        and hasattr(original, "model_copy")
        and not isinstance(original, type)
    ):
        fields = original.model_dump()  # a message, or another pydantic model
        changes = {k: revive(fields.get(k), v) for k, v in edited.items() if k in fields}
        changes = {k: v for k, v in changes.items() if plain(fields.get(k)) != plain(v)}
        return original.model_copy(update=changes)
    return edited


class LangGraphAgent(Agent):
    """The agent of runs that agentrun's workers execute for a registered graph.

    Input: `graph` (a name in AGENTRUN_LANGGRAPH_GRAPHS), `thread_id` (the run is that
    thread), optionally `input` (the graph's input for its first super-step); a fork's
    input also names the checkpoint it starts from (`fork`)."""

    name = AGENT
    description = "A registered LangGraph graph, one super-step a step"
    # A recorded fork re-executes the graph's nodes: its wrapped model and tools answer
    # from the parent's record (agentrun.integrations.langgraph.recorded).
    replays_decisions = False

    def __init__(self) -> None:
        self.serde = JsonPlusSerializer()

    # --- runs and forks ------------------------------------------------------------

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        graph_named(input.get("graph"))
        thread = input.get("thread_id")
        if not isinstance(thread, str) or not thread.strip():
            raise InvalidInput("thread_id must be a non-empty string (the LangGraph thread)")
        if len(thread) > MAX_THREAD_ID:
            raise InvalidInput(f"thread_id is {len(thread)} characters; at most {MAX_THREAD_ID}")
        if Run.objects.filter(pk=run_id_for(thread)).exists():
            raise InvalidInput(f"thread {thread!r} has a run already: fork it to go on from it")
        extra = set(input) - {"graph", "thread_id", "input"}
        if extra:
            raise InvalidInput(f"unknown input field(s): {', '.join(sorted(extra))}")

    def run_id(self, input: dict[str, Any]) -> Any:
        return run_id_for(input["thread_id"])

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        return {}  # a thread's channels before its first checkpoint

    def summary(self, input: dict[str, Any]) -> str:
        return f"LangGraph thread {input.get('thread_id')}"

    def fork_input(
        self, parent: Any, step: int, at: str, state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        info = parent.input if isinstance(parent.input, dict) else {}
        if info.get("checkpoint_ns"):
            raise ValueError(
                "this run is a subgraph's namespace: fork the thread's run, whose "
                "checkpoints the graph resumes from"
            )
        row = Step.objects.filter(run=parent, number=step).values_list("decision", flat=True)
        decision = row.first() or {}
        lg = decision.get("langgraph")
        if not lg or "checkpoint_id" not in lg:
            raise ValueError(f"step {step} of this run holds no LangGraph checkpoint")
        checkpoint_id = lg["checkpoint_id"] if at == "post" else lg.get("parent_checkpoint_id")
        if not checkpoint_id:
            raise ValueError(
                f"step {step} is the thread's first checkpoint: before it there is nothing "
                "to go on from; fork from its post snapshot"
            )
        if at == "pre":
            lg = self._checkpoint_info(parent, checkpoint_id) or lg
        graph = info.get("graph") or graph_for_channels(set(lg.get("channel_versions", {})))
        channels = set(graph_named(graph).channels)
        unknown = sorted(set(state) - channels)
        if unknown:
            raise ValueError(f"the graph has no channel {unknown[0]!r}")
        thread = f"{info.get('thread_id')}~{uuid.uuid4().hex[:8]}"
        if len(thread) > MAX_THREAD_ID:
            thread = f"fork-{uuid.uuid4()}"
        fork = {"thread_id": info.get("thread_id"), "checkpoint_id": checkpoint_id}
        return {"graph": graph, "thread_id": thread, "fork": fork}, {THREAD_LABEL: thread}

    def _checkpoint_info(self, run: Any, checkpoint_id: str) -> dict[str, Any] | None:
        found = Step.objects.filter(run=run, decision__langgraph__checkpoint_id=checkpoint_id)
        decision = found.values_list("decision", flat=True).first()
        return (decision or {}).get("langgraph")

    # --- a step: one super-step -----------------------------------------------------

    def decide(self, state: dict[str, Any], ctx: Any) -> Decision:
        input = ctx.input
        graph = graph_named(input["graph"])
        secret = sorted(c for c in graph.channels if is_secret_key(c))
        if secret:
            # The engine redacts a decision before storing it: the checkpoint's record
            # of such a channel would be hidden, and LangGraph could not read it back.
            raise AgentError(
                f"the graph's channel {secret[0]!r} is named like a secret, and agentrun "
                "redacts the values of such keys: rename it to run the graph here"
            )
        thread = input["thread_id"]
        config = _config(thread)
        memory = _Memory(serde=self.serde)
        driven = graph.copy(update={"checkpointer": memory})
        run = Run.objects.only("mode", "parent_id", "first_step", "divergence_step").get(
            pk=ctx.run_id
        )
        first = ctx.step == run.first_step
        previous = None if first else self._previous(ctx.run_id, ctx.step)
        graph_input: Any = None
        forked_from = None
        if first and "fork" in input:
            seed = self._seed_fork(memory, driven, input, state, config)
            forked_from = input["fork"]
        elif first:
            seed = None
            graph_input = input.get("input")
        else:
            assert previous is not None
            seed = AgentrunSaver(serde=self.serde).get_tuple(
                _config(thread, previous["checkpoint_id"])
            )
            if seed is None:
                raise AgentError(f"the thread's checkpoint {previous['checkpoint_id']} is gone")
            self._put_seed(memory, seed, config)
        seed_id = seed.checkpoint["id"] if seed is not None else None
        with recorded.answering(run, ctx.step):
            # The graph's model and tool calls may take long: no connection meanwhile.
            release_connection()
            more = asyncio.run(_one_super_step(driven, graph_input, config, seed_id))
        made = memory.get_tuple(config)
        if made is None or made.checkpoint["id"] == seed_id:
            raise AgentError(
                "the graph wrote no checkpoint in this super-step (a node interrupted? "
                "resuming an interrupt is not supported in runs agentrun executes)"
            )
        return self._decision(ctx.step, made, seed, previous, forked_from, first, more)

    def _previous(self, run_id: Any, number: int) -> dict[str, Any]:
        row = Step.objects.filter(run_id=run_id, number=number - 1).values_list(
            "decision", "checkpoint"
        )
        decision, record = row.first() or (None, None)
        decision, record = decision or {}, record or {}
        if "langgraph" not in decision or "blob_at" not in record:
            raise AgentError(f"step {number - 1} of this thread holds no LangGraph checkpoint")
        return {**decision["langgraph"], "blob_at": record["blob_at"]}

    def _put_seed(self, memory: InMemorySaver, seed: Any, config: RunnableConfig) -> None:
        checkpoint = seed.checkpoint.copy()
        stored = memory.put(config, checkpoint, seed.metadata, dict(checkpoint["channel_versions"]))
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in seed.pending_writes or []:
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            memory.put_writes(stored, writes, task_id)

    def _seed_fork(
        self,
        memory: InMemorySaver,
        driven: Any,
        input: dict[str, Any],
        state: dict[str, Any],
        config: RunnableConfig,
    ) -> Any:
        """The parent's checkpoint in the fork's thread, with the edits (the channels whose
        value differs from the parent's) applied by update_state: the graph's reducers
        apply them as they apply any update."""
        source = input["fork"]
        parent = AgentrunSaver(serde=self.serde).get_tuple(
            _config(source["thread_id"], source["checkpoint_id"])
        )
        if parent is None:
            raise AgentError(f"the parent's checkpoint {source['checkpoint_id']} is gone")
        self._put_seed(memory, parent._replace(pending_writes=[]), config)
        values = parent.checkpoint.get("channel_values", {})
        edits = {
            channel: revive(values.get(channel), value)
            for channel, value in state.items()
            if plain(values.get(channel)) != value
        }
        if edits:
            driven.update_state(config, edits)
        return memory.get_tuple(config)

    def _decision(
        self,
        number: int,
        made: Any,
        seed: Any,
        previous: dict[str, Any] | None,
        forked_from: dict[str, Any] | None,
        first: bool,
        more: bool,
    ) -> Decision:
        """The new checkpoint as the saver stores a step's: its `langgraph` record for
        people in the decision, its serialized record for LangGraph as the decision's
        `checkpoint` (each value it wrote whole)."""
        cp: dict[str, Any] = dict(made.checkpoint)
        values = cp.pop("channel_values", None) or {}
        versions = cp["channel_versions"]
        before = (previous or {}).get("channel_versions", {})
        blob_at: dict[str, int] = {}
        written: dict[str, Any] = {}
        for channel, version in versions.items():
            if first or before.get(channel) != plain(version):
                blob_at[channel] = number
                written[channel] = version
            elif previous is not None and channel in previous["blob_at"]:
                blob_at[channel] = previous["blob_at"][channel]
        blobs = {
            channel: checkpoints.whole(*self.serde.dumps_typed(values[channel]))
            if channel in values
            else ["empty"]
            for channel in written
        }
        seen_before = (previous or {}).get("versions_seen", {})
        if seed is not None and previous is None:
            seen_before = plain(seed.checkpoint.get("versions_seen", {}))
        seen = plain(cp.get("versions_seen", {}))
        md = dict(made.metadata or {})
        info = {
            "checkpoint_id": cp["id"],
            # A fork's thread begins at its first checkpoint (`forked_from` names the
            # parent's); LangGraph's own parent of it was never stored in this thread.
            "parent_checkpoint_id": (previous or {}).get("checkpoint_id"),
            "checkpoint_ns": "",
            "source": md.get("source"),
            "step": md.get("step"),
            "nodes": sorted(
                k
                for k, v in seen.items()
                # LangGraph marks what a resumed run has seen under `__interrupt__`.
                if seen_before.get(k) != v and k not in ("__input__", "__interrupt__")
            ),
            "metadata": plain(md),
            "channel_versions": plain(versions),
            "versions_seen": seen,
            "written": plain(written),
            "writes": [],
            "interrupts": [],
        }
        if forked_from is not None:
            info["forked_from"] = forked_from
        info["interrupts"] = _interrupts(info)
        record = {
            "checkpoint": _packed(self.serde.dumps_typed(cp)),
            "metadata": _packed(self.serde.dumps_typed(md)),
            "blobs": blobs,
            "blob_at": blob_at,
            "writes": [],
        }
        return Decision(
            thought=_summary(info),
            final=None if more else _final_text(values),
            extra={"langgraph": info},
            checkpoint=record,
        )

    def update(
        self, state: dict[str, Any], decision: Decision, results: list[Any], ctx: Any
    ) -> dict[str, Any]:
        """The channel values after the super-step: those it wrote, decoded from the
        checkpoint's record (stored whole), and the others as they were."""
        info = decision.extra["langgraph"]
        if decision.checkpoint is None:
            raise AgentError(f"step {ctx.step} holds no serialized LangGraph checkpoint")
        blobs = decision.checkpoint["blobs"]
        out: dict[str, Any] = {}
        for channel in info["channel_versions"]:
            blob = blobs.get(channel)
            if blob is not None:
                if blob[0] != "empty":
                    value = self.serde.loads_typed((blob[1], checkpoints.data(blob[2])))
                    out[channel] = plain(value)
            elif channel in state:
                out[channel] = state[channel]
        return out


async def _one_super_step(graph: Any, graph_input: Any, config: RunnableConfig, seed: Any) -> bool:
    """Run the graph until it has written a checkpoint after `seed`; whether the graph has
    nodes left to run. Async, so graphs whose nodes are coroutines run too (LangGraph runs
    plain functions on its threads)."""
    stream = graph.astream(graph_input, config, stream_mode="checkpoints", durability="sync")
    try:
        async for event in stream:
            if event["config"]["configurable"]["checkpoint_id"] != seed:
                return bool(event["next"])  # the nodes it has left to run
    finally:
        await stream.aclose()
    return False


def _final_text(values: dict[str, Any]) -> str:
    """What a finished graph answered: its last message's text, when it has messages."""
    messages = values.get("messages")
    if isinstance(messages, list) and messages:
        content = getattr(messages[-1], "content", None)
        if isinstance(content, str):
            return content
    return "the graph finished"


register(LangGraphAgent)
