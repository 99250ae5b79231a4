"""The checkpoint saver: LangGraph threads as agentrun runs, checkpoints as steps.

How the two models map:

- A thread is a run, and each subgraph namespace of the thread (`checkpoint_ns`, e.g.
  `child:<task id>`) a run of its own, a child run: its `input` names the thread, the
  namespace and the thread's root run, and it carries the thread's labels. The run's id
  is derived from (thread id, namespace) (`run_id_for`), so finding it is one lookup.
- A checkpoint is a step, numbered in the order the checkpoints were put. Its pre
  snapshot is the channel values of its parent checkpoint (nothing for the first), its
  post snapshot its own channel values, both decoded to plain JSON (`plain`) in the
  delta store, so the timeline, diffs, watches and search work on them.
- A LangGraph branch (a checkpoint whose parent is not the one put before it: a replay
  or an `update_state` from an older checkpoint) is a step too, its pre snapshot the
  parent's state: the step's decision names the parent checkpoint.
- The step's decision holds, for people, `langgraph`: the checkpoint and parent ids, the
  nodes that ran in the super-step (those whose `versions_seen` changed), the
  metadata, the pending writes and interrupts. For LangGraph, the step's `checkpoint`
  column (compressed, `agentrun.store.checkpoints`) holds the checkpoint, its metadata,
  the channel values it wrote and its pending writes as the saver's serializer (`serde`)
  wrote them, so LangGraph reads back exactly what it stored. A channel value is stored
  once, in the step that wrote its version; later steps point at that step. A list that
  grew by appending (`messages`) is stored as its new items after the previous value's.

The run is left succeeded after each checkpoint (a thread has no end; it never waits for
an agentrun worker, which could not run it).
"""

from __future__ import annotations

import builtins
import queue
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection, transaction
from django.db.models import Min, Q
from django.utils import timezone
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import INTERRUPT

from agentrun.integrations.langgraph.plain import plain
from agentrun.lifecycle import labels as run_labels
from agentrun.models import Run, RunStatus, Snapshot, Step, StepStatus
from agentrun.store import checkpoints, rawsql, snapshots
from agentrun.store.codec import LEVEL, Prepared, json_text

#: The `agent` of every run this saver writes.
AGENT = "langgraph"
#: Label keys: the thread's id, and a subgraph run's namespace.
THREAD_LABEL = "langgraph.thread"
NAMESPACE_LABEL = "langgraph.ns"

_RUN_IDS = uuid.UUID("5b0c3e0a-6f1d-4b8e-9a43-1f2ad6c1e0a7")


def run_id_for(thread_id: Any, checkpoint_ns: str = "") -> uuid.UUID:
    """The id of the run that holds a thread's checkpoints in one namespace."""
    return uuid.uuid5(_RUN_IDS, f"{thread_id}\x00{checkpoint_ns}")


#: The threads whose last checkpoint a saver keeps (`_Last`), so the next one is put
#: without reading it back: the most recently written ones.
KEPT_THREADS = 64


@dataclass
class _New:
    """A checkpoint being put, and what is worked out of it on the way."""

    config: RunnableConfig
    cp: dict[str, Any]
    md: dict[str, Any]
    new_versions: ChannelVersions
    now: Any = field(default_factory=timezone.now)
    values: dict[str, Any] = field(init=False)
    early_info: dict[str, Any] = field(default_factory=lambda: {"writes": []})
    early_writes: list[Any] = field(default_factory=list)
    written: dict[str, tuple[str, bytes, int, int]] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    blob_at: dict[str, int] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    stored: bytes = b""

    def __post_init__(self) -> None:
        self.values = self.cp.pop("channel_values", None) or {}


@dataclass
class _Last:
    """What a saver keeps of the last checkpoint it put in a run. `key` is the step's pk
    and the checkpoint's id: a step rolled back and made again may get the same pk
    (SQLite), never with another checkpoint's id."""

    key: tuple[int, str]
    number: int
    info: dict[str, Any]  # the step's decision["langgraph"]
    blob_at: dict[str, int]
    blobs: dict[str, tuple[str, bytes, int, int]]  # written: kind, bytes, chain, keyframe
    state: dict[str, Any]  # the post snapshot's state
    node: Any  # its hash tree
    snapshot: Snapshot  # the post snapshot
    decision: dict[str, Any]  # the step's decision and record, as stored
    record: dict[str, Any]
    stored: bytes  # the record's stored bytes (what put_writes compares and sets)

    @classmethod
    def of(cls, step: Step, new: _New, post: Snapshot, node: Any) -> _Last:
        return cls(
            (step.pk, new.cp["id"]),
            step.number,
            new.info,
            new.blob_at,
            new.written,
            new.state,
            node,
            post,
            step.decision or {},
            new.record,
            new.stored,
        )


def _packed(typed: tuple[str, bytes]) -> list[str]:
    kind, data = typed
    return [kind, checkpoints.text(data)]


def _unpacked(packed: Sequence[str]) -> tuple[str, bytes]:
    return packed[0], checkpoints.data(packed[1])


class AgentrunSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer storing checkpoints in agentrun's database (the Django
    project's: SQLite or PostgreSQL). Django must be set up before it is used."""

    def __init__(self, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        # run id -> what this saver kept of the last checkpoint it put in the run.
        self._threads: OrderedDict[Any, _Last] = OrderedDict()
        self._db = _DatabaseThread()
        # Runs where this saver made writes wait for their checkpoint's put.
        self._early: set[Any] = set()
        self._lock = threading.Lock()

    # --- writing ----------------------------------------------------------------

    def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        parent_id = conf.get("checkpoint_id")
        md = dict(get_checkpoint_metadata(config, metadata))
        new = _New(config, dict(checkpoint), md, new_versions)
        run_id = run_id_for(thread_id, ns)
        last = self._kept(run_id, parent_id)
        if last is None or not self._put_after(run_id, last, new):
            self._forget([run_id])
            with transaction.atomic():
                run = self._run(thread_id, ns, config, new.now)
                waiting = self._waiting(run, new.cp["id"])
                if waiting is not None:
                    # The checkpoint's writes came first (LangGraph doesn't wait for a
                    # put to write the writes of the tasks it starts): they waited on a
                    # step of their own, numbered below the run's steps, which this step
                    # replaces.
                    new.early_info = _decision(waiting)["langgraph"]
                    new.early_writes = (waiting.checkpoint or {}).get("writes", [])
                    waiting.delete()
                self._put_anew(run, new)
        return {
            "configurable": {
                "thread_id": conf["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": new.cp["id"],
            }
        }

    def _put_after(self, run_id: Any, last: _Last, new: _New) -> bool:
        """Put a checkpoint whose parent is the run's last step, put by this saver: one
        guarded statement (the compare-and-set of the run's next step number, the
        snapshots, the step), with nothing read first. False if another writer got there
        first (nothing is written then)."""
        number = last.number + 1
        step, post, node = self._prepared(run_id, number, new, last, None, last.info, last.blob_at)
        pre = snapshots.reference(run_id, number, "pre", last.snapshot)
        run_values = {"next_step": number + 1, "finished_at": new.now, "updated_at": new.now}
        write = rawsql.Guarded(
            _RUN_PUT,
            [rawsql.prep(Run, k, v) for k, v in run_values.items()]
            + [rawsql.prep(Run, "id", run_id), number],
        )
        write.insert(Snapshot, rawsql.insert_fields(pre))
        # Compressed alone, not packed against its keyframe's text as the engine's are: a
        # thread's run id comes from its thread id, so a thread deleted and written again
        # has the same run id, and a keyframe text remembered from before would not match.
        write.insert(Snapshot, rawsql.insert_fields(post))
        write.insert(Step, rawsql.insert_fields(step), returning=True)
        write.select(Step, _WAITING, [rawsql.prep(Step, "run_id", run_id)] * 2)
        try:
            done = write.execute()
        except IntegrityError:
            return False
        if done is None:
            return False
        step.pk = done[0]
        self._keep(run_id, _Last.of(step, new, post, node))
        with self._lock:
            early = run_id in self._early
        if done[1] is not None or early:
            self._adopt_waiting(run_id, step.pk, new.cp["id"])
        return True

    def _put_anew(self, run: Run, new: _New) -> None:
        """Put a checkpoint in a transaction of the caller's, reading what it needs."""
        parent_id = new.config["configurable"].get("checkpoint_id")
        parent = self._step(run.pk, parent_id) if parent_id else None
        parent_info = _decision(parent)["langgraph"] if parent else {}
        parent_at = (parent.checkpoint or {}).get("blob_at", {}) if parent else {}
        number = run.next_step
        step, post, node = self._prepared(run.pk, number, new, None, parent, parent_info, parent_at)
        pre, pre_state = self._pre_snapshot(run, number, parent)
        post, node = snapshots.build(run.pk, number, "post", new.state, pre, pre_state)
        step.state_size = post.size
        Snapshot.objects.bulk_create([pre, post])
        step.save(force_insert=True)
        Run.objects.filter(pk=run.pk).update(
            next_step=number + 1, finished_at=new.now, updated_at=new.now
        )
        self._keep(run.pk, _Last.of(step, new, post, node))

    def _prepared(
        self,
        run_id: Any,
        number: int,
        new: _New,
        last: _Last | None,
        parent: Step | None,
        parent_info: dict[str, Any],
        parent_at: dict[str, int],
    ) -> tuple[Step, Snapshot, Any]:
        """The checkpoint's step (unsaved) and, after `last`, its post snapshot (unsaved)
        and hash tree; without `last` the caller builds the snapshot (the state is in `new`)."""
        cp, values, new_versions, md = new.cp, new.values, new.new_versions, new.md
        blob_at: dict[str, int] = {}
        same: set[str] = set()  # channels at the parent's version
        missing = []
        for channel, version in cp["channel_versions"].items():
            if channel in new_versions:
                blob_at[channel] = number
            elif parent_info and parent_info["channel_versions"].get(channel) == plain(version):
                same.add(channel)
                if channel in parent_at:
                    blob_at[channel] = parent_at[channel]
            else:
                missing.append((channel, plain(version)))
        if missing:
            blob_at.update(self._writers(run_id, missing))
        blobs: dict[str, list[Any]] = {}
        for channel in new_versions:
            if channel not in values:
                blobs[channel] = ["empty"]
                continue
            kind, data = self.serde.dumps_typed(values[channel])
            base = None
            if last and channel in last.blobs and parent_at.get(channel) == last.number:
                base = (last.number, *last.blobs[channel])
            blobs[channel], chain, keyframe = checkpoints.blob(kind, data, base)
            new.written[channel] = (kind, data, chain, number if keyframe < 0 else keyframe)
        new.state = self._post_state(cp, values, same, blobs, last)
        seen_before = parent_info["versions_seen"] if parent_info else {}
        seen = plain(cp.get("versions_seen", {}))
        nodes = sorted(k for k, v in seen.items() if seen_before.get(k) != v and k != "__input__")
        info = {
            "checkpoint_id": cp["id"],
            "parent_checkpoint_id": new.config["configurable"].get("checkpoint_id"),
            "checkpoint_ns": new.config["configurable"].get("checkpoint_ns", "") or "",
            "source": md.get("source"),
            "step": md.get("step"),
            "nodes": nodes,
            "metadata": plain(md),
            "channel_versions": plain(cp["channel_versions"]),
            "versions_seen": seen,
            "written": plain(dict(new_versions)),
            "writes": new.early_info["writes"],
            "interrupts": [],
        }
        info["interrupts"] = _interrupts(info)
        new.info, new.blob_at = info, blob_at
        new.record = {
            "checkpoint": _packed(self.serde.dumps_typed(cp)),
            "metadata": _packed(self.serde.dumps_typed(md)),
            "blobs": blobs,
            "blob_at": blob_at,
            "writes": new.early_writes,
        }
        new.stored = _stored(new.record)
        post = node = None
        if last is not None:
            pre = snapshots.reference(run_id, number, "pre", last.snapshot)
            post, node = snapshots.build(
                run_id, number, "post", new.state, pre, last.state, prev_node=last.node
            )
        step = rawsql.instance(
            Step,
            {
                "run_id": run_id,
                "number": number,
                "status": StepStatus.SUCCEEDED,
                "attempts": 1,
                "decision": {"thought": _summary(info), "langgraph": info},
                "checkpoint": new.stored,
                "decided_at": new.now,
                "decision_count": 1,
                "started_at": new.now,
                "finished_at": new.now,
                "duration_ms": 0.0,
                "state_size": post.size if post is not None else None,
            },
        )
        return step, post, node  # type: ignore[return-value]

    def _adopt_waiting(self, run_id: Any, step_pk: int, checkpoint_id: str) -> None:
        """Writes of the checkpoint that waited for its put (put by `_put_after`, which
        doesn't look first): moved onto its step."""
        self._forget([run_id])
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            waiting = self._waiting(run, checkpoint_id)
            others = Step.objects.filter(run=run, number__lt=run.first_step)
            if waiting is not None:
                others = others.exclude(pk=waiting.pk)
            if not others.exists():
                with self._lock:
                    self._early.discard(run_id)
            if waiting is None:
                return
            step = Step.objects.select_for_update().get(pk=step_pk)
            info, record = _decision(step)["langgraph"], step.checkpoint or {}
            info["writes"] = _decision(waiting)["langgraph"]["writes"] + info["writes"]
            record["writes"] = (waiting.checkpoint or {}).get("writes", []) + record["writes"]
            info["interrupts"] = _interrupts(info)
            _decision(step)["thought"] = _summary(info)
            Step.objects.filter(pk=step.pk).update(decision=step.decision, checkpoint=record)
            waiting.delete()

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        ns = conf.get("checkpoint_ns", "") or ""
        run_id = run_id_for(conf["thread_id"], ns)
        if self._put_writes_on_last(run_id, conf["checkpoint_id"], writes, task_id, task_path):
            return
        with transaction.atomic():
            run = self._run(str(conf["thread_id"]), ns, config, timezone.now())
            step = self._step(run_id, conf["checkpoint_id"], done=False)
            if step is None:
                # Writes of a checkpoint not put yet: they wait for the put on a step
                # numbered below the run's first, so the steps stay in checkpoint order.
                below = Step.objects.filter(run=run, number__lt=run.first_step)
                lowest = below.aggregate(n=Min("number"))["n"]
                # A put of this checkpoint running now may have read the database before
                # this commit (its statement waits on the run row this holds): it looks
                # here once it is done (`_put_after`).
                with self._lock:
                    self._early.add(run_id)
                step = Step.objects.create(
                    run=run,
                    number=(run.first_step if lowest is None else lowest) - 1,
                    status=StepStatus.RUNNING,
                    decision={
                        "thought": "LangGraph checkpoint (not written yet)",
                        "langgraph": {
                            "checkpoint_id": conf["checkpoint_id"],
                            "writes": [],
                            "interrupts": [],
                        },
                    },
                    checkpoint={"writes": []},
                )
            record = step.checkpoint or {"writes": []}
            self._merge_writes(_decision(step), record, writes, task_id, task_path)
            stored = _stored(record)
            Step.objects.filter(pk=step.pk).update(decision=step.decision, checkpoint=stored)
            with self._lock:
                last = self._threads.get(run_id)
                if last is not None and last.key[0] == step.pk:
                    last.decision, last.record, last.stored = _decision(step), record, stored

    def _put_writes_on_last(
        self,
        run_id: Any,
        checkpoint_id: str,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> bool:
        """Writes of the last checkpoint this saver put in the run (the usual case): one
        UPDATE of its step, compared and set on the step's record as this saver wrote it
        (a write of another thread or process in between makes it a miss: False)."""
        with self._lock:
            last = self._threads.get(run_id)
            if last is None or last.key[1] != checkpoint_id:
                return False
            info = last.decision["langgraph"]
            decision = {**last.decision, "langgraph": {**info, "writes": list(info["writes"])}}
            record = {**last.record, "writes": list(last.record["writes"])}
            step_pk, before = last.key[0], last.stored
        self._merge_writes(decision, record, writes, task_id, task_path)
        stored = _stored(record)
        row = rawsql.run_statement(
            _WRITES_PUT,
            [
                rawsql.prep(Step, "decision", decision),
                rawsql.prep(Step, "checkpoint", stored),
                step_pk,
                rawsql.prep(Step, "checkpoint", before),
            ],
        )
        if row is None:
            return False
        with self._lock:
            if last.stored is before:
                last.decision, last.record, last.stored = decision, record, stored
        return True

    def _merge_writes(
        self,
        decision: dict[str, Any],
        record: dict[str, Any],
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        """A task's writes added to a step's decision (plain) and record (serialized)."""
        info = decision["langgraph"]
        stored_writes = record["writes"]
        index = {(w[0], w[1]): i for i, w in enumerate(stored_writes)}
        for idx, (channel, value) in enumerate(writes):
            key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            shown = {
                "task_id": task_id,
                "task_path": task_path,
                "channel": channel,
                "value": plain(value),
            }
            stored = [*key, channel, *_packed(self.serde.dumps_typed(value)), task_path]
            if key in index:
                if key[1] >= 0:
                    continue  # a task's regular writes are stored once
                stored_writes[index[key]] = stored
                info["writes"][index[key]] = shown
            else:
                index[key] = len(stored_writes)
                stored_writes.append(stored)
                info["writes"].append(shown)
        info["interrupts"] = _interrupts(info)
        if "nodes" in info:  # a step put already (not one waiting for its put)
            decision["thought"] = _summary(info)

    def _delete_thread(self, thread_id: str) -> None:
        with transaction.atomic():
            runs = Run.objects.filter(agent=AGENT, input__thread_id=str(thread_id))
            self._forget(list(runs.values_list("pk", flat=True)))
            Snapshot.objects.filter(run__in=runs).delete()
            Step.objects.filter(run__in=runs).delete()
            runs.delete()

    # --- reading ----------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "") or ""
        run_id = run_id_for(thread_id, ns)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            step = self._step(run_id, checkpoint_id)
        else:
            step = (
                Step.objects.filter(run_id=run_id, status=StepStatus.SUCCEEDED)
                .order_by("-number")
                .first()
            )
        if step is None:
            return None
        records = {step.number: step.checkpoint or {}}
        self._read_bases(run_id, records, records[step.number]["blob_at"].values())
        return self._tuple(conf["thread_id"], ns, _decision(step), step.number, records, {})

    def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        runs = Run.objects.filter(agent=AGENT)
        conf = (config or {}).get("configurable", {})
        if "thread_id" in conf:
            runs = runs.filter(input__thread_id=str(conf["thread_id"]))
        if "checkpoint_ns" in conf:
            runs = runs.filter(input__checkpoint_ns=conf["checkpoint_ns"] or "")
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        threads = dict(runs.values_list("pk", "input__thread_id"))
        # (order_by(): a step's default order is by run, which joins the runs' table)
        steps = Step.objects.filter(run__in=list(threads), status=StepStatus.SUCCEEDED)
        rows = steps.order_by().values_list("run_id", "number", "decision", "checkpoint")
        by_run: dict[Any, dict[int, Any]] = {}
        records: dict[Any, dict[int, Any]] = {}
        for run_id, number, decision, record in rows:
            by_run.setdefault(run_id, {})[number] = decision
            records.setdefault(run_id, {})[number] = record or {}
        found = []
        for run_id, decisions in by_run.items():
            for number, decision in decisions.items():
                cid = decision["langgraph"]["checkpoint_id"]
                if wanted_id and cid != wanted_id:
                    continue
                if before_id and cid >= before_id:
                    continue
                found.append((cid, run_id, number, decision))
        found.sort(key=lambda f: f[0], reverse=True)
        chosen: builtins.list[tuple[str, Any, int, dict[str, Any]]] = []
        for cid, run_id, number, decision in found:
            if limit is not None and len(chosen) >= limit:
                break
            if filter:
                md = self.serde.loads_typed(_unpacked(records[run_id][number]["metadata"]))
                if not all(md.get(k) == v for k, v in filter.items()):
                    continue
            chosen.append((cid, run_id, number, decision))
        # The values of a run's checkpoints are decoded once for all of them, oldest
        # first, so an appended list decodes only its new items.
        memos: dict[Any, dict[tuple[int, str], Any]] = {run_id: {} for run_id in records}
        tuples = {}
        for _cid, run_id, number, decision in sorted(chosen, key=lambda c: c[2]):
            ns = decision["langgraph"]["checkpoint_ns"]
            tuples[(run_id, number)] = self._tuple(
                threads[run_id], ns, decision, number, records[run_id], memos[run_id]
            )
        for _cid, run_id, number, _ in chosen:
            yield tuples[(run_id, number)]

    # --- the sync methods: on the saver's database thread, unless called in a transaction
    # or on the main thread (`_DatabaseThread`) ------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._db.call(self._put, config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._db.call(self._put_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self._db.call(self._delete_thread, thread_id)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._db.call(self._get_tuple, config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        found = self._db.call(
            lambda: list(self._list(config, filter=filter, before=before, limit=limit))
        )
        yield from found

    # --- async: the same work on a thread, as Django's ORM is synchronous ----------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await sync_to_async(self.get_tuple)(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await sync_to_async(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )()
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await sync_to_async(self.put)(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await sync_to_async(self.put_writes)(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await sync_to_async(self.delete_thread)(thread_id)

    # --- helpers ----------------------------------------------------------------

    def _run(self, thread_id: str, ns: str, config: RunnableConfig, now: Any) -> Run:
        """The run of (thread, namespace), locked; made on the thread's first checkpoint."""
        run_id = run_id_for(thread_id, ns)
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is not None:
            return run
        root = run_id_for(thread_id, "")
        new = Run(
            id=run_id,
            agent=AGENT,
            status=RunStatus.SUCCEEDED,
            phase="",
            input={
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                **({"thread_run": str(root)} if ns else {}),
                "config": plain(
                    {
                        k: v
                        for k, v in config.get("configurable", {}).items()
                        if not k.startswith("__") and k != "checkpoint_id"
                    }
                ),
            },
            started_at=now,
            finished_at=now,
        )
        try:
            with transaction.atomic():  # a put and a write may both be the first
                new.save(force_insert=True)
                run_labels.store(new, _labels(thread_id, ns, config))
        except IntegrityError:
            pass  # the other one made it
        return Run.objects.select_for_update().get(pk=run_id)

    def _waiting(self, run: Run, checkpoint_id: str) -> Step | None:
        """The step on which a checkpoint's writes wait for its put (below the run's steps)."""
        return Step.objects.filter(
            run=run,
            number__lt=run.first_step,
            status=StepStatus.RUNNING,
            decision__langgraph__checkpoint_id=checkpoint_id,
        ).first()

    def _step(self, run_id: Any, checkpoint_id: str, done: bool = True) -> Step | None:
        """The step of a checkpoint; with done=False also one that waits for its put."""
        steps = Step.objects.filter(run_id=run_id, decision__langgraph__checkpoint_id=checkpoint_id)
        if done:
            steps = steps.filter(status=StepStatus.SUCCEEDED)
        return steps.order_by("-number").first()

    def _writers(self, run_id: Any, missing: Sequence[tuple[str, Any]]) -> dict[str, int]:
        """The steps that wrote these (channel, version)s: a checkpoint whose parent is not
        given, or whose parent had other versions."""
        wanted = dict(missing)
        found: dict[str, int] = {}
        rows = Step.objects.filter(run_id=run_id).order_by("-number")
        for number, written in rows.values_list("number", "decision__langgraph__written"):
            for channel, version in (written or {}).items():
                if wanted.get(channel) == version and channel not in found:
                    found[channel] = number
            if len(found) == len(wanted):
                break
        return found

    def _kept(self, run_id: Any, parent_id: str | None) -> _Last | None:
        """What this saver kept of the run's last checkpoint, if it is the parent."""
        with self._lock:
            last = self._threads.get(run_id)
        if last is None or parent_id is None or last.key[1] != parent_id:
            return None
        return last

    def _keep(self, run_id: Any, last: _Last) -> None:
        with self._lock:
            self._threads.pop(run_id, None)
            self._threads[run_id] = last
            while len(self._threads) > KEPT_THREADS:
                self._threads.popitem(last=False)

    def _forget(self, run_ids: Any) -> None:
        with self._lock:
            for run_id in run_ids:
                self._threads.pop(run_id, None)

    def _post_state(
        self,
        cp: dict[str, Any],
        values: dict[str, Any],
        same: set[str],
        blobs: dict[str, builtins.list[Any]],
        last: _Last | None,
    ) -> dict[str, Any]:
        """The checkpoint's values as plain JSON. A value at the parent's version is the
        parent's; a list stored as an extension of the parent's has the parent's items
        (the same bytes) and plain versions of its new ones only."""
        state: dict[str, Any] = {}
        for channel in cp["channel_versions"]:
            if channel not in values:
                continue
            kept = last.state.get(channel) if last else None
            stored = blobs.get(channel)
            if channel in same and last and channel in last.state:
                state[channel] = kept
            elif (
                last is not None
                and isinstance(kept, list)
                and stored is not None
                and checkpoints.extends(stored) == (last.number, len(kept))
                and isinstance(values[channel], list | tuple)
            ):
                state[channel] = kept + plain(list(values[channel][len(kept) :]))
            else:
                state[channel] = plain(values[channel])
        return state

    def _read_bases(self, run_id: Any, records: dict[int, Any], numbers: Any) -> None:
        """Add to `records` the steps a checkpoint's values are read from: the steps that
        wrote them, then the steps back to their keyframes."""
        needed = set(numbers) - set(records)
        if needed:
            records.update(
                Step.objects.filter(run_id=run_id, number__in=needed)
                .order_by()
                .values_list("number", "checkpoint")
            )
        ranges = Q()
        for number in set(numbers):
            for stored in records[number]["blobs"].values():
                keyframe = checkpoints.needs(stored)
                if keyframe is not None:
                    ranges |= Q(number__gte=keyframe, number__lt=number)
        if ranges:
            rows = Step.objects.filter(
                ranges, run_id=run_id, status=StepStatus.SUCCEEDED
            ).order_by()
            records.update(
                rows.exclude(number__in=list(records)).values_list("number", "checkpoint")
            )

    def _pre_snapshot(
        self, run: Run, number: int, parent: Step | None
    ) -> tuple[Snapshot, dict[str, Any]]:
        """The step's pre snapshot (unsaved): its parent checkpoint's values, and them."""
        prev = Snapshot.objects.filter(run=run).defer("data").order_by("-seq").first()
        prev_state = snapshots.load_state(prev) if prev is not None else None
        if parent is not None and prev is not None and parent.number == number - 1:
            return snapshots.reference(run.pk, number, "pre", prev), prev_state or {}
        pre_state = snapshots.load(run.pk, parent.number, "post") if parent else {}
        pre, _ = snapshots.build(run.pk, number, "pre", pre_state, prev, prev_state)
        return pre, pre_state

    def _tuple(
        self,
        thread_id: Any,
        ns: str,
        decision: dict[str, Any],
        number: int,
        records: Mapping[int, Any],
        memo: dict[tuple[int, str], Any],
    ) -> CheckpointTuple:
        info, record = decision["langgraph"], records[number]
        checkpoint = self.serde.loads_typed(_unpacked(record["checkpoint"]))
        values = {}
        for channel, at in record["blob_at"].items():
            value = self._value(records, at, channel, memo)
            if value is not _NOTHING:
                values[channel] = value
        checkpoint["channel_values"] = values
        parent_id = info["parent_checkpoint_id"]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": info["checkpoint_id"],
                }
            },
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(_unpacked(record["metadata"])),
            parent_config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": parent_id,
                }
            }
            if parent_id
            else None,
            pending_writes=[
                (task_id, channel, self.serde.loads_typed((kind, checkpoints.data(data))))
                for task_id, _idx, channel, kind, data, _path in record["writes"]
            ],
        )

    def _value(
        self,
        records: Mapping[int, Any],
        number: int,
        channel: str,
        memo: dict[tuple[int, str], Any],
    ) -> Any:
        """The channel's value stored in step `number`: a list of its own (its items may be
        the same objects as in another value of this call's), or a value decoded anew."""
        stored = records[number]["blobs"].get(channel)
        if stored is None or stored[0] == "empty":
            return _NOTHING
        listed = self._listed(records, number, channel, memo)
        if listed is not None:
            return list(listed)
        return self.serde.loads_typed((stored[1], checkpoints.data(stored[2])))

    def _listed(
        self,
        records: Mapping[int, Any],
        number: int,
        channel: str,
        memo: dict[tuple[int, str], Any],
    ) -> builtins.list[Any] | None:
        """A list value decoded once per call (`memo`): an extension's base items, then its
        own; a keyframe whose base is decoded already decodes only the items after it."""
        key = (number, channel)
        if key in memo:
            return memo[key]
        stored = records[number]["blobs"][channel]
        if stored[0] != "ext" and (len(stored) < 7 or (stored[4], channel) not in memo):
            return None
        kind, data, items, base_number, base_items = stored[1:6]
        base = self._listed(records, base_number, channel, memo)
        if base is None:
            kind, whole = checkpoints.value_bytes(records, base_number, channel) or ("", b"")
            base = self.serde.loads_typed((kind, whole))
            memo[(base_number, channel)] = base
        tail = checkpoints.data(data)
        if stored[0] == "full":
            tail = tail[stored[6] :]
        header = checkpoints.array_header(items - base_items)
        value = base + self.serde.loads_typed((kind, header + tail))
        memo[key] = value
        return value


class _DatabaseThread:
    """LangGraph calls a saver from threads of its own (a graph's background puts, an
    executor's). Each would keep a database connection for the thread's life, and a
    connection pool runs dry; giving it back after each call costs a connection check
    (a round trip) at the next. So calls from other threads run on one thread of the
    saver's, one at a time (as `PostgresSaver` serializes on its one connection), which
    keeps its connection between calls and gives it back after `IDLE` seconds without
    one, when it ends. Calls inside a transaction of the caller's run in it; calls from
    the main thread run there, on its own connection, as any Django code would."""

    IDLE = 1.0

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, tuple[Any, ...], Future[Any]]]
        self._calls = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def call(self, fn: Any, *args: Any) -> Any:
        here = threading.current_thread()
        if connection.in_atomic_block or here is threading.main_thread() or here is self._thread:
            return fn(*args)
        done: Future[Any] = Future()
        with self._lock:
            self._calls.put((fn, args, done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="agentrun-saver", daemon=True
                )
                self._thread.start()
        return done.result()

    def _serve(self) -> None:
        while True:
            try:
                fn, args, done = self._calls.get(timeout=self.IDLE)
            except queue.Empty:
                with self._lock:
                    if self._calls.empty():
                        connection.close()
                        self._thread = None
                        return
                continue
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller
                done.set_exception(exc)
                if connection.connection is not None and not connection.is_usable():
                    connection.close()  # a dead connection (a server restart): a new one next


_NOTHING = object()


def _stored(record: dict[str, Any]) -> Prepared:
    """A step's record as its column stores it (compressed JSON text)."""
    return Prepared(zlib.compress(json_text(record).encode(), LEVEL))


# The compare-and-set of a put after the run's last step: the step number is still free.
_RUN_PUT = (
    "UPDATE agentrun_run SET next_step = %s, finished_at = %s, updated_at = %s"
    " WHERE id = %s AND next_step = %s"
)
# A task's writes on the step of the run's last checkpoint, if its record is as this saver
# wrote it last (prepared on PostgreSQL: sent once per step).
_WRITES_PUT = (
    "UPDATE agentrun_step SET decision = %s, checkpoint = %s WHERE id = %s AND checkpoint = %s"
    " RETURNING id"
)
# Any writes waiting for a checkpoint's put in the run (read before the put's write).
_WAITING = (
    "SELECT id FROM agentrun_step WHERE run_id = %s AND status = 'running' AND number <"
    " (SELECT first_step FROM agentrun_run WHERE id = %s) LIMIT 1"
)


def _decision(step: Step) -> dict[str, Any]:
    """A step's decision (the saver's steps always have one)."""
    return step.decision or {}


def _interrupts(info: dict[str, Any]) -> list[Any]:
    return [w["value"] for w in info["writes"] if w["channel"] == INTERRUPT]


def _summary(info: dict[str, Any]) -> str:
    """The step's one line on the run page: what ran, and an interrupt."""
    source = info.get("source") or "checkpoint"
    if info["nodes"]:
        text = f"LangGraph {source} step {info.get('step')}: {', '.join(info['nodes'])} ran"
    else:
        text = f"LangGraph {source} step {info.get('step')}"
    if info["interrupts"]:
        text += f" · interrupted ({len(info['interrupts'])})"
    return text


def _labels(thread_id: str, ns: str, config: RunnableConfig) -> dict[str, str]:
    """The run's labels: the thread's id (and namespace), then the config's metadata and
    configurable values that make valid labels (strings, numbers, booleans)."""
    out: dict[str, str] = {}
    candidates = [(THREAD_LABEL, thread_id)]
    if ns:
        candidates.append((NAMESPACE_LABEL, ns.split("|")[-1].split(":")[0]))
    for source in (config.get("metadata") or {}, config.get("configurable") or {}):
        for key, value in source.items():
            # LangGraph's own keys (langgraph_node, langgraph_step...) are on the steps.
            if key.startswith(("__", "langgraph_", "checkpoint_")) or key == "thread_id":
                continue
            if isinstance(value, bool | int | float | str):
                candidates.append((str(key), str(value)))
    for key, value in candidates:
        if len(out) >= run_labels.MAX_LABELS:
            break
        if key in out or key in run_labels.RESERVED_KEYS:
            continue
        if run_labels.key_problem(key) or run_labels.value_problem(key, value):
            continue
        out[key] = value
    return out
