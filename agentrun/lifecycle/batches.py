"""Replay batches: every run an incident hit, forked again on the fixed code, sandbox first.

A batch is made from a selection (the run list's filter, `agentrun.lifecycle.selection`)
and a rule for where each run is forked from (`before-failure`: the pre snapshot of its
first failed step; `start`; `{"tool": T}`: before its first call to T; `{"step": N}`).
`plan` answers what a batch would do without writing anything (the preview); `create`
writes the batch and its items in one transaction, each run with its fork point or the
reason it is skipped. Forks are then made as room frees up (`advance`: at most
`max_in_flight` of a batch's forks active at once, so a batch never takes every worker from
the other runs), each asking for the batch's code version. When a fork ends, its verdict
against its parent is recorded: fixed, still failing, failing differently, changed side
effects, unchanged (or cancelled). `promote` replays live, as a new batch, the runs whose
fork succeeded; `cancel` stops new forks and lets those made finish.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from agentrun.agents import InvalidInput
from agentrun.audit.events import record_event
from agentrun.engine.versions import InvalidVersion, check_version
from agentrun.infra.queue import ask
from agentrun.lifecycle import selection as runs_selection
from agentrun.lifecycle import services
from agentrun.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    BatchItem,
    BatchStatus,
    ItemStatus,
    ReplayBatch,
    Run,
    RunStatus,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
    Verdict,
)
from agentrun.security import storable
from agentrun.telemetry import tracing

MODES = services.FORK_MODES
NAME_MAX_LENGTH = 200
REASON_MAX_LENGTH = services.REASON_MAX_LENGTH
SIDE_EFFECT_KINDS = ("write", "hybrid")


class BatchError(ValueError):
    """A batch request that can't be honoured; `field` names the member at fault. Nothing
    is written."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


# --- where each run is forked from ---------------------------------------------------------


@dataclass(frozen=True)
class StartFrom:
    kind: str  # before-failure | start | tool | step
    tool: str = ""
    step: int = 0

    def as_json(self) -> Any:
        if self.kind == "tool":
            return {"tool": self.tool}
        if self.kind == "step":
            return {"step": self.step}
        return self.kind

    def describe(self) -> str:
        return {
            "before-failure": "before its first failed step",
            "start": "from its start",
            "tool": f"before its first call to {self.tool}",
            "step": f"at step {self.step}",
        }[self.kind]


def parse_from(value: Any) -> StartFrom:
    if value in (None, ""):
        return StartFrom("before-failure")
    if value in ("before-failure", "start"):
        return StartFrom(value)
    if isinstance(value, str) and value.startswith("tool:") and len(value) > 5:
        value = {"tool": value[5:]}
    elif isinstance(value, str) and value.startswith("step:") and value[5:].isdigit():
        value = {"step": int(value[5:])}
    if isinstance(value, dict) and set(value) == {"tool"}:
        tool = value["tool"]
        if not isinstance(tool, str) or not tool.strip() or len(tool) > 100:
            raise BatchError("from.tool must be a tool's name", "from")
        return StartFrom("tool", tool=tool.strip())
    if isinstance(value, dict) and set(value) == {"step"}:
        step = value["step"]
        if isinstance(step, bool) or not isinstance(step, int) or not 0 < step < 2**30:
            raise BatchError("from.step must be a step number (1 or more)", "from")
        return StartFrom("step", step=step)
    raise BatchError(
        'from must be "before-failure", "start", {"tool": "<name>"} or {"step": <n>}', "from"
    )


def fork_points(runs: list[Run], start: StartFrom) -> dict[Any, int | str]:
    """Each run's fork step (the pre snapshot of that step), or why it has none: a few
    queries for all the runs, not one per run."""
    ids = [r.pk for r in runs]
    found: dict[Any, int | str] = {}
    if start.kind == "before-failure":
        first = dict(
            Step.objects.filter(run_id__in=ids, status=StepStatus.FAILED)
            .values("run_id")
            .annotate(n=Min("number"))
            .values_list("run_id", "n")
        )
        none = "no failed step"
    elif start.kind == "tool":
        first = dict(
            ToolCall.objects.filter(run_id__in=ids, tool=start.tool)
            .values("run_id")
            .annotate(n=Min("step__number"))
            .values_list("run_id", "n")
        )
        none = f"no call to {start.tool}"
    elif start.kind == "start":
        first = {r.pk: r.first_step for r in runs}
        none = "no steps"
    else:
        first = {r.pk: start.step for r in runs}
        none = f"no step {start.step}"
    wanted = {Snapshot.seq_for(n, "pre") for n in first.values()}
    have = set(
        Snapshot.objects.filter(run_id__in=list(first), seq__in=wanted).values_list("run_id", "seq")
    )
    for run in runs:
        n = first.get(run.pk)
        if run.purged_at is not None:
            found[run.pk] = "purged by retention: its snapshots are gone"
        elif n is None:
            found[run.pk] = none
        elif (run.pk, Snapshot.seq_for(n, "pre")) not in have:
            found[run.pk] = f"no pre snapshot of step {n}"
        else:
            found[run.pk] = n
    return found


# --- the plan (preview) --------------------------------------------------------------------


@dataclass
class PlannedRun:
    run: Run
    step: int | None
    skip_reason: str = ""


@dataclass
class Plan:
    start: StartFrom
    mode: str
    version: str
    items: list[PlannedRun] = field(default_factory=list)
    side_effects: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(1 for i in self.items if i.step is not None)

    @property
    def skipped(self) -> int:
        return sum(1 for i in self.items if i.step is None)


def max_runs() -> int:
    return settings.AGENTRUN_BATCH_MAX_RUNS


def check_options(mode: Any, version: Any) -> tuple[str, str]:
    if mode not in MODES:
        raise BatchError(f"mode must be one of {', '.join(MODES)}", "mode")
    if version is None:
        return mode, ""
    try:
        return mode, check_version(version)
    except InvalidVersion as exc:
        raise BatchError(str(exc), "version") from None


def select(filter: Any) -> list[Run]:
    try:
        chosen = runs_selection.parse(filter)
    except runs_selection.SelectionError as exc:
        raise BatchError(f"filter: {exc}", "filter") from None
    limit = max_runs()
    runs = list(chosen.apply(Run.objects.all()).order_by("created_at", "id")[: limit + 1])
    if len(runs) > limit:
        raise BatchError(
            f"the filter selects more than {limit} runs; a batch takes at most {limit}"
            " (narrow the filter: a time window, a label, an error)",
            "filter",
        )
    return runs


def plan(filter: Any, start_from: Any, mode: Any = "sandbox", version: Any = None) -> Plan:
    """What a batch would fork, from where, and (for a live one) which side effects it
    would let happen again, by tool. Writes nothing."""
    start = parse_from(start_from)
    mode, version = check_options(mode, version)
    runs = select(filter)
    return _plan(runs, start, mode, version, fork_points(runs, start))


def _plan(
    runs: list[Run], start: StartFrom, mode: str, version: str, points: dict[Any, int | str]
) -> Plan:
    out = Plan(start, mode, version)
    for run in runs:
        point = points[run.pk]
        if isinstance(point, int):
            out.items.append(PlannedRun(run, point))
        else:
            out.items.append(PlannedRun(run, None, point))
    if mode == "live":
        out.side_effects = _side_effects_after({i.run.pk: i.step for i in out.items if i.step})
    return out


def _side_effects_after(points: dict[Any, int]) -> dict[str, int]:
    """The parents' write/hybrid calls at or after each one's fork step, counted by tool."""
    counts: Counter[str] = Counter()
    rows = ToolCall.objects.filter(run_id__in=list(points), kind__in=SIDE_EFFECT_KINDS).values_list(
        "run_id", "tool", "step__number"
    )
    for run_id, tool, number in rows:
        if number >= points[run_id]:
            counts[tool] += 1
    return dict(sorted(counts.items()))


# --- making one ----------------------------------------------------------------------------


def _text(value: Any, name: str, limit: int, *, required: bool) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise BatchError(f"{name} must be text", name)
    value = value.strip()
    if required and not value:
        raise BatchError(f"a batch needs a {name} (e.g. the incident it repairs)", name)
    if len(value) > limit:
        raise BatchError(f"the {name} is {len(value)} characters; at most {limit}", name)
    problem = storable.shape_problem(value, text=True, what=name)
    if problem:
        raise BatchError(problem, name)
    return value


def _in_flight(value: Any) -> int:
    if value in (None, ""):
        return settings.AGENTRUN_BATCH_MAX_IN_FLIGHT
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
        raise BatchError("max_in_flight must be a whole number from 1 to 10000", "max_in_flight")
    return value


def create(
    filter: Any,
    start_from: Any = "before-failure",
    *,
    mode: Any = "sandbox",
    version: Any = None,
    name: Any,
    reason: Any = "",
    max_in_flight: Any = None,
    user: Any = None,
    confirm_live: bool = False,
) -> ReplayBatch:
    """Make a batch (everything checked first; BatchError and nothing written otherwise)."""
    name = _text(name, "name", NAME_MAX_LENGTH, required=True)
    reason = _text(reason, "reason", REASON_MAX_LENGTH, required=False)
    limit = _in_flight(max_in_flight)
    the_plan = plan(filter, start_from, mode, version)
    return _create(the_plan, name, reason, limit, user, confirm_live, filter or {}, None)


def _create(
    the_plan: Plan,
    name: str,
    reason: str,
    limit: int,
    user: Any,
    confirm_live: bool,
    filter: Any,
    promoted_from: ReplayBatch | None,
) -> ReplayBatch:
    if the_plan.count == 0:
        why = Counter(i.skip_reason for i in the_plan.items).most_common(1)
        raise BatchError(
            "no run to replay: the filter selects no run"
            if not the_plan.items
            else f"no run to replay: none of the {len(the_plan.items)} selected runs has a"
            f" fork point {the_plan.start.describe()} (e.g. {why[0][0]})",
            "filter",
        )
    if the_plan.mode == "live" and not confirm_live:
        total = sum(the_plan.side_effects.values())
        raise BatchError(
            f"a live batch runs write and hybrid tools for real ({total} call(s) known from"
            " the runs it replays): confirm it",
            "confirm_live",
        )
    with transaction.atomic():
        batch = ReplayBatch.objects.create(
            name=name,
            reason=reason,
            selection=filter,
            start_from=the_plan.start.as_json(),
            mode=the_plan.mode,
            version=the_plan.version,
            max_in_flight=limit,
            promoted_from=promoted_from,
            created_by=user,
        )
        BatchItem.objects.bulk_create(
            [
                BatchItem(
                    batch=batch,
                    position=k,
                    parent=item.run,
                    step=item.step,
                    status=ItemStatus.PENDING if item.step else ItemStatus.SKIPPED,
                    skip_reason=item.skip_reason,
                )
                for k, item in enumerate(the_plan.items)
            ],
            batch_size=1000,
        )
        record_event(
            "batch_promoted" if promoted_from else "batch_created",
            user=user,
            reason=reason,
            payload={
                "batch": str(batch.pk),
                "name": name,
                "mode": batch.mode,
                "version": batch.version,
                "from": batch.start_from,
                "filter": filter,
                "runs": the_plan.count,
                "skipped": the_plan.skipped,
                **({"promoted_from": str(promoted_from.pk)} if promoted_from else {}),
                **({"side_effects": the_plan.side_effects} if the_plan.mode == "live" else {}),
            },
        )
        ask("agentrun.batch_advance", batch.pk, "the batch's first forks")
    return batch


# --- running it ----------------------------------------------------------------------------


def advance(batch_id: Any) -> dict[str, int]:
    """Record the verdicts of the forks that ended, make new forks while the batch has room,
    and end the batch when nothing is left. Safe to call any time, from anywhere: each
    change is a short transaction holding the batch's row, so two calls never make more
    forks than the batch has room for, and none holds the database for long."""
    with transaction.atomic():
        batch = ReplayBatch.objects.select_for_update().filter(pk=batch_id).first()
        if batch is None:
            return {"forked": 0, "judged": 0}
        judged = _judge(batch)
    made = 0
    while True:
        with transaction.atomic():
            batch = ReplayBatch.objects.select_for_update().get(pk=batch_id)
            items = BatchItem.objects.filter(batch=batch)
            if batch.status != BatchStatus.RUNNING:
                break
            active = items.filter(status=ItemStatus.FORKED, fork__status__in=ACTIVE_STATUSES)
            if active.count() >= batch.max_in_flight:
                break
            item = items.filter(status=ItemStatus.PENDING).select_related("parent").first()
            if item is None:
                break
            made += _fork(batch, item)
    with transaction.atomic():
        batch = ReplayBatch.objects.select_for_update().get(pk=batch_id)
        left = BatchItem.objects.filter(batch=batch).filter(
            Q(status=ItemStatus.PENDING) | Q(status=ItemStatus.FORKED, verdict="")
        )
        if batch.status == BatchStatus.RUNNING and not left.exists():
            batch.status = BatchStatus.DONE
            batch.finished_at = timezone.now()
            batch.save(update_fields=["status", "finished_at"])
            transaction.on_commit(lambda: tracing.emit_batch(batch_id))
    return {"forked": made, "judged": judged}


def _fork(batch: ReplayBatch, item: BatchItem) -> int:
    """Fork one item's run (in a savepoint: a refused fork skips the item, saying why)."""
    try:
        with transaction.atomic():
            fork = services.fork_run(
                item.parent,
                step=item.step,
                at="pre",
                mode=batch.mode,
                reason=f"replay batch {batch.name}" + (f": {batch.reason}" if batch.reason else ""),
                user=batch.created_by,
                confirm_live=True,  # confirmed for the whole batch when it was made
                version=batch.version or None,
                batch=batch,
            )
    except (services.ForkError, InvalidInput) as exc:
        item.status, item.skip_reason = ItemStatus.SKIPPED, f"fork refused: {exc}"
        item.save(update_fields=["status", "skip_reason"])
        return 0
    item.status, item.fork = ItemStatus.FORKED, fork
    item.save(update_fields=["status", "fork"])
    return 1


def _judge(batch: ReplayBatch) -> int:
    ended = list(
        BatchItem.objects.filter(
            batch=batch, status=ItemStatus.FORKED, verdict="", fork__status__in=TERMINAL_STATUSES
        ).select_related("parent", "fork")
    )
    for item in ended:
        assert item.fork is not None
        item.verdict = verdict(item.parent, item.fork, item.step or item.fork.first_step)
    BatchItem.objects.bulk_update(ended, ["verdict"])
    return len(ended)


_VOLATILE = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}|\b[0-9a-f]{8,}\b|\d+",
    re.IGNORECASE,
)


def same_error(a: str, b: str) -> bool:
    """Two errors read the same once ids and numbers are set aside."""
    return _VOLATILE.sub("#", a.strip()) == _VOLATILE.sub("#", b.strip())


def side_effects(run: Run, from_step: int) -> list[tuple[str, str]]:
    """A run's write/hybrid calls from a step on, as (tool, arguments), in order."""
    rows = (
        ToolCall.objects.filter(run=run, kind__in=SIDE_EFFECT_KINDS, step__number__gte=from_step)
        .order_by("step__number", "index")
        .values_list("tool", "args")
    )
    return [(tool, json.dumps(args, sort_keys=True)) for tool, args in rows]


def verdict(parent: Run, fork: Run, from_step: int) -> str:
    if fork.status == RunStatus.CANCELLED:
        return Verdict.CANCELLED
    if parent.status == RunStatus.FAILED:
        if fork.status == RunStatus.SUCCEEDED:
            return Verdict.FIXED
        same = same_error(parent.error, fork.error)
        return Verdict.STILL_FAILING if same else Verdict.FAILING_DIFFERENTLY
    if fork.status == RunStatus.FAILED:
        return Verdict.FAILING_DIFFERENTLY
    if side_effects(parent, from_step) != side_effects(fork, from_step):
        return Verdict.CHANGED_SIDE_EFFECTS
    return Verdict.UNCHANGED


def wake(run: Run) -> None:
    """A run of a batch ended: let the batch go on (its next forks, its verdicts)."""
    if run.batch_id is not None:
        ask("agentrun.batch_advance", run.batch_id, "the batch's next forks")


def advance_all() -> int:
    """Advance every running batch (the reconciler: a lost message delays a batch by one
    pass, never stops it)."""
    ids = list(ReplayBatch.objects.filter(status=BatchStatus.RUNNING).values_list("pk", flat=True))
    for batch_id in ids:
        advance(batch_id)
    return len(ids)


# --- operators' actions --------------------------------------------------------------------


def cancel(batch: ReplayBatch, *, user: Any, reason: Any = "") -> ReplayBatch:
    """No new forks; those made run to their end and get their verdicts."""
    reason = _text(reason, "reason", REASON_MAX_LENGTH, required=False)
    with transaction.atomic():
        n = ReplayBatch.objects.filter(pk=batch.pk, status=BatchStatus.RUNNING).update(
            status=BatchStatus.CANCELLED, finished_at=timezone.now()
        )
        if n != 1:
            raise BatchError(f"the batch is {batch.status}; only a running batch can be cancelled")
        pending = BatchItem.objects.filter(batch=batch, status=ItemStatus.PENDING).update(
            status=ItemStatus.SKIPPED, skip_reason="the batch was cancelled before its fork"
        )
        record_event(
            "batch_cancelled",
            user=user,
            reason=reason,
            payload={"batch": str(batch.pk), "name": batch.name, "not_forked": pending},
        )
        transaction.on_commit(lambda: tracing.emit_batch(batch.pk))
    batch.refresh_from_db()
    return batch


def promotable(batch: ReplayBatch) -> list[BatchItem]:
    """The items whose fork succeeded: what a promotion replays live."""
    return list(
        BatchItem.objects.filter(
            batch=batch, status=ItemStatus.FORKED, fork__status=RunStatus.SUCCEEDED
        )
        .select_related("parent")
        .order_by("position")
    )


def promotion_plan(batch: ReplayBatch, *, version: Any = None) -> Plan:
    """What a promotion would replay live (BatchError if the batch can't be promoted)."""
    if batch.mode == "live":
        raise BatchError("this batch ran live already: there is nothing to promote")
    if batch.status == BatchStatus.RUNNING:
        raise BatchError("the batch is still running: promote it once its forks have ended")
    _, version = check_options("live", (batch.version or None) if version is None else version)
    the_plan = Plan(StartFrom("step"), "live", version)
    if isinstance(batch.start_from, str | dict):
        the_plan.start = parse_from(batch.start_from)
    items = promotable(batch)
    for item in items:
        the_plan.items.append(PlannedRun(item.parent, item.step))
    # What the sandbox forks would have written: what the live replay will write.
    the_plan.side_effects = dict(
        sorted(
            Counter(
                ToolCall.objects.filter(
                    run_id__in=[i.fork_id for i in items], kind__in=SIDE_EFFECT_KINDS
                ).values_list("tool", flat=True)
            ).items()
        )
    )
    return the_plan


def promote(
    batch: ReplayBatch,
    *,
    user: Any,
    name: Any = None,
    reason: Any = "",
    version: Any = None,
    max_in_flight: Any = None,
    confirm_live: bool = False,
) -> ReplayBatch:
    """Replay live, as a new batch, the runs whose fork in this one succeeded."""
    the_plan = promotion_plan(batch, version=version)
    name = _text(name or f"{batch.name} (live)", "name", NAME_MAX_LENGTH, required=True)
    reason = _text(reason, "reason", REASON_MAX_LENGTH, required=False)
    limit = _in_flight(batch.max_in_flight if max_in_flight is None else max_in_flight)
    if the_plan.count == 0:
        raise BatchError("no fork of this batch succeeded: there is nothing to promote")
    return _create(the_plan, name, reason, limit, user, confirm_live, batch.selection, batch)


# --- progress ------------------------------------------------------------------------------

RUN_STATES = ("pending", "running", "succeeded", "failed", "cancelled", "skipped")


def counts(batch: ReplayBatch) -> dict[str, dict[str, int]]:
    """How many of the batch's runs are in each state, and how many have each verdict."""
    by_state: dict[str, int] = dict.fromkeys(RUN_STATES, 0)
    rows = (
        BatchItem.objects.filter(batch=batch)
        .values_list("status", "fork__status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for status, fork_status, n in rows:
        if status == ItemStatus.FORKED:
            state = "running" if fork_status in ACTIVE_STATUSES else fork_status
        else:
            state = status
        by_state[state] = by_state.get(state, 0) + n
    spent = Run.objects.filter(batch=batch).aggregate(
        tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), cost_usd=Sum("cost_usd")
    )
    by_verdict: dict[str, int] = dict.fromkeys(Verdict.values, 0)
    for value, n in (
        BatchItem.objects.filter(batch=batch)
        .exclude(verdict="")
        .values_list("verdict")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        by_verdict[value] = n
    return {
        "runs": by_state,
        "verdicts": by_verdict,
        "spent": {k: v or 0 for k, v in spent.items()},
    }


def by_verdict(batch: ReplayBatch) -> dict[str, list[BatchItem]]:
    out: dict[str, list[BatchItem]] = defaultdict(list)
    for item in (
        BatchItem.objects.filter(batch=batch)
        .exclude(verdict="")
        .select_related("parent", "fork")
        .order_by("position")
    ):
        out[item.verdict].append(item)
    return out
