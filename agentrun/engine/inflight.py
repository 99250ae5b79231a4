"""What is in flight now: every active run's current step, and what it waits on.

Derived from the database alone, the truth (DESIGN section 2): nothing on the
step path writes anything for it. A run's state follows from its row and the
row of the step it is at (`run.next_step`):

- running and leased (`lease_owner` set, `lease_expires_at` still ahead): its
  worker holds the step. Without a recorded decision it is *deciding* (waiting
  on the LLM or the agent's policy); with one it is *acting* (on its tools).
- running or queued with the lease run out: *stalled*; the reconciler
  re-enqueues it. Without any lease: *queued*, waiting for a worker to claim it
  (a new run, an approved one, or the next step of a run handed back to the queue).
- waiting: *backoff* (until `wake_at`), *approval*, *crashed* or *in doubt* (an operator
  decides).

The worker is the lease owner without its last part: `host:pid:uuid8` is
`host:pid`, one worker process. How long a step has waited is counted from the
last moment the database knows it moved: the claim of this attempt (deciding), the
decision or the latest call record of this attempt (acting), the lease's expiry
(stalled), the park or the queueing (the rest).

Two queries: the active runs with their current step (the run_status_created
index, then step_run_number), and the open tool calls of the steps on show.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import (
    Case,
    CharField,
    Count,
    DateTimeField,
    F,
    FilteredRelation,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentrun.models import ACTIVE_STATUSES, Run, RunStatus, ToolCall, ToolCallStatus, WaitReason


@dataclass(frozen=True)
class State:
    key: str
    short: str  # in a line of counts: "30 on a tool"
    title: str
    meaning: str


STATES = (
    State("deciding", "deciding", "Deciding", "waiting on the LLM (or the agent's policy)"),
    State("acting", "on a tool", "On a tool", "running the tool calls it decided on"),
    State("backoff", "backoff", "In backoff", "failed for now; retried at its wake-up time"),
    State("approval", "approval", "Waiting for approval", "an operator approves or rejects a call"),
    State(
        "in_doubt",
        "in doubt",
        "In doubt",
        "a side effect may or may not have happened; an operator decides",
    ),
    State(
        "crashed",
        "crashed",
        "Crashed: waiting for an operator",
        "its step kept crashing (or its agent is unknown to the worker); an operator retries it",
    ),
    State(
        "stalled",
        "stalled",
        "Stalled: lease expired",
        "its worker stopped renewing the lease; the reconciler re-enqueues it",
    ),
    State("queued", "queued", "Queued", "ready, not yet claimed by a worker"),
)
BY_KEY = {s.key: s for s in STATES}
# Listed, capped, on the page; queued runs are mostly a count.
LIMIT = 50
MAX_LIMIT = 500
QUEUED_SHOWN = 5
# The worker "filter" for runs nobody holds (parked or queued): a real one has a colon.
NO_WORKER = "none"
ERROR_CHARS = 300

_OPEN_CALLS = (
    ToolCallStatus.PLANNED,
    ToolCallStatus.INTENT,
    ToolCallStatus.AWAITING_APPROVAL,
    ToolCallStatus.IN_DOUBT,
)


@dataclass(frozen=True)
class Call:
    """The tool call a step is on: running, awaiting approval, in doubt or to be retried."""

    index: int
    tool: str
    kind: str
    status: str
    attempt: int  # attempts started so far
    running: bool  # an attempt started and not (yet) ended
    error: str
    attempt_at: datetime | None  # when the latest attempt started


@dataclass
class Item:
    """One run in flight, at its current step."""

    run_id: UUID
    agent: str
    state: str
    worker: str  # host:pid, "" when nobody holds it
    lease_owner: str
    step: int
    step_id: int | None  # None: the step's row doesn't exist yet (never claimed)
    attempt: int
    since: datetime
    waited_s: float
    tools: tuple[str, ...]
    wake_at: datetime | None
    wake_in_s: float | None  # negative: overdue
    call: Call | None = None
    error: str = ""  # why a crashed run waits


@dataclass
class Group:
    state: State
    count: int  # all of them (under the filter), not only those listed
    items: list[Item]

    @property
    def more(self) -> int:
        return self.count - len(self.items)


@dataclass
class WorkerRow:
    worker: str  # "" for runs nobody holds
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def cells(self) -> list[tuple[State, int]]:
        return [(s, self.counts.get(s.key, 0)) for s in STATES]


@dataclass
class InFlight:
    now: datetime
    counts: dict[str, int]  # every active run, by state
    workers: list[WorkerRow]  # the matrix: worker x state
    groups: list[Group]  # under the filter, longest wait first
    worker: str = ""  # the filter
    state: str = ""
    limit: int = LIMIT

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def shown_state(self) -> State | None:
        """The state the lists are filtered to, if any."""
        return BY_KEY.get(self.state)

    @property
    def in_flight(self) -> int:
        """Steps a worker holds or that wait mid-step: everything but the queue."""
        return self.total - self.counts.get("queued", 0)


def worker_of(lease_owner: str) -> str:
    """`host:pid:uuid8` → `host:pid`: the worker process behind a lease."""
    if lease_owner.count(":") >= 2:
        return lease_owner.rsplit(":", 1)[0]
    return lease_owner


@dataclass(frozen=True)
class _Rule:
    when: Q
    state: str
    since: Any  # an expression: since when a run in this state has waited


def _rules(now: datetime) -> list[_Rule]:
    """In order: the first rule whose condition holds gives a run its state (the last one
    holds always). One table for the counts and the lists, evaluated by the database."""
    waiting = Q(status=RunStatus.WAITING)
    updated = F("updated_at")
    return [
        _Rule(waiting & Q(wait_reason=WaitReason.BACKOFF), "backoff", updated),
        _Rule(waiting & Q(wait_reason=WaitReason.APPROVAL), "approval", updated),
        _Rule(waiting & Q(wait_reason=WaitReason.CRASHED), "crashed", updated),
        # in_doubt, and any other parked run: only an operator moves it on.
        _Rule(waiting, "in_doubt", updated),
        _Rule(Q(lease_owner="") | Q(lease_expires_at__isnull=True), "queued", updated),
        _Rule(Q(lease_expires_at__lt=now), "stalled", F("lease_expires_at")),
        # A retried step's row is older than this attempt's claim (the run's updated_at).
        _Rule(
            Q(cur__decided_at__isnull=True),
            "deciding",
            Greatest(Coalesce("cur__started_at", updated), updated),
        ),
        _Rule(Q(), "acting", Greatest(Coalesce("cur__decided_at", updated), updated)),
    ]


def _state_case(rules: list[_Rule]) -> Case:
    *first, last = rules
    return Case(
        *(When(r.when, then=Value(r.state)) for r in first),
        default=Value(last.state),
        output_field=CharField(),
    )


def _since_case(rules: list[_Rule]) -> Case:
    *first, last = rules
    return Case(
        *(When(r.when, then=r.since) for r in first),
        default=last.since,
        output_field=DateTimeField(),
    )


def _active(now: datetime) -> QuerySet[Any]:
    """Active runs with `state` and their current step as `cur` (Any: a type checker
    knows a model's fields, not its annotations)."""
    # The run_status_created index finds the active runs; step_run_number their step.
    return (
        Run.objects.filter(status__in=ACTIVE_STATUSES, imported_at__isnull=True)
        .annotate(
            cur=FilteredRelation("steps", condition=Q(steps__number=F("next_step"))),
            state=_state_case(_rules(now)),
        )
        .order_by()
    )


def counts(now: datetime | None = None) -> dict[str, int]:
    """How many active runs are in each state: one aggregate query (the run list's header)."""
    now = now or timezone.now()
    found = {
        row["state"]: row["n"]
        for row in _active(now).values("state").annotate(n=Count("id")).order_by()
    }
    return {s.key: found.get(s.key, 0) for s in STATES}


def snapshot(
    now: datetime | None = None, *, worker: str = "", state: str = "", limit: int = LIMIT
) -> InFlight:
    """Everything in flight at `now`: counts, the worker x state matrix, and per state
    the runs that have waited longest (at most `limit` each; queued ones fewer unless
    asked for), optionally only one worker's (NO_WORKER: nobody's) or one state's."""
    if state and state not in BY_KEY:
        raise ValueError(f"unknown state {state!r}; known: {', '.join(BY_KEY)}")
    now = now or timezone.now()
    items = [_item(row, now) for row in _rows(now)]
    by_state: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        if _matches(item, worker, state):
            by_state[item.state].append(item)
    groups = []
    for s in STATES:
        if state and s.key != state:
            continue
        found = sorted(by_state[s.key], key=lambda i: (i.since, str(i.run_id)))
        cap = limit if (state or s.key != "queued") else min(limit, QUEUED_SHOWN)
        groups.append(Group(s, len(found), found[:cap]))
    _attach_calls([i for g in groups for i in g.items])
    return InFlight(
        now=now,
        counts=_tally(i.state for i in items),
        workers=_matrix(items),
        groups=groups,
        worker=worker,
        state=state,
        limit=limit,
    )


def _matches(item: Item, worker: str, state: str) -> bool:
    if state and item.state != state:
        return False
    if worker == NO_WORKER:
        return item.worker == ""
    return not worker or item.worker == worker


def _tally(states: Iterable[str]) -> dict[str, int]:
    counted = Counter(states)
    return {s.key: counted[s.key] for s in STATES}


def _rows(now: datetime, run_id: Any = None) -> Iterable[dict[str, Any]]:
    active = _active(now)
    if run_id is not None:
        active = active.filter(pk=run_id)
    return active.values(
        "id",
        "agent",
        "lease_owner",
        "next_step",
        "wake_at",
        "state",
        "error",
        since=_since_case(_rules(now)),
        step_id=F("cur__id"),
        attempts=F("cur__attempts"),
        # Only the calls: a decision also holds the raw LLM request and response.
        calls=F("cur__decision__calls"),
    )


def explain(run_id: Any, now: datetime | None = None) -> str:
    """Why a run is where it is, in a sentence with what to check: for `startrun --wait`
    and anyone asking why a run isn't moving. "" when the run is not active."""
    now = now or timezone.now()
    rows = list(_rows(now, run_id))
    if not rows:
        return ""
    item = _item(rows[0], now)
    _attach_calls([item])
    waited = f"{item.waited_s:.0f}s"
    step = f"step {item.step}" + (f" (attempt {item.attempt})" if item.attempt > 1 else "")
    if item.state == "queued":
        if item.step_id is None:
            return (
                f"queued for {waited}: no worker has claimed {step} yet. Is a worker running "
                "(`celery -A agentrun worker`, or `make up`) on this database and broker?"
            )
        return f"queued for {waited}: {step} waits for a worker to claim it again"
    if item.state == "deciding":
        return (
            f"{step} on worker {item.worker}: waiting {waited} on the LLM (or the agent's policy)"
        )
    if item.state == "acting":
        call = item.call
        what = f"tool {call.tool} (attempt {call.attempt})" if call else "its tool calls"
        return f"{step} on worker {item.worker}: running {what} for {waited}"
    if item.state == "stalled":
        return (
            f"{step}: its worker {item.worker or '?'} stopped renewing the lease {waited} ago "
            "(it died or hangs); the reconciler (a worker started with -B, or celery beat) "
            "hands the step to another worker"
        )
    if item.state == "backoff":
        wake = f"in {item.wake_in_s:.0f}s" if (item.wake_in_s or 0) > 0 else "now"
        error = f" after: {item.call.error}" if item.call and item.call.error else ""
        return f"{step} is backing off; tried again {wake}{error}"
    state = BY_KEY[item.state]
    return f"{step}: {state.meaning}" + (f": {item.error}" if item.error else "")


def _item(row: dict[str, Any], now: datetime) -> Item:
    since = row["since"]
    calls = row["calls"] if isinstance(row["calls"], list) else []
    wake = row["wake_at"] if row["state"] == "backoff" else None
    owner = row["lease_owner"] if row["state"] in ("deciding", "acting", "stalled") else ""
    return Item(
        run_id=row["id"],
        agent=row["agent"],
        state=row["state"],
        worker=worker_of(owner),
        lease_owner=owner,
        step=row["next_step"],
        attempt=row["attempts"] or 0,
        since=since,
        waited_s=max((now - since).total_seconds(), 0.0),
        tools=tuple(str(c.get("tool", "?")) for c in calls if isinstance(c, dict)),
        wake_at=wake,
        wake_in_s=(wake - now).total_seconds() if wake else None,
        step_id=row["step_id"],
        error=row["error"] if row["state"] == "crashed" else "",
    )


def _matrix(items: list[Item]) -> list[WorkerRow]:
    by_worker: dict[str, Counter[str]] = defaultdict(Counter)
    for item in items:
        by_worker[item.worker][item.state] += 1
    rows = [WorkerRow(w, dict(c)) for w, c in by_worker.items()]
    # Workers by name; the runs nobody holds last.
    return sorted(rows, key=lambda r: (r.worker == "", r.worker))


def _attach_calls(items: list[Item]) -> None:
    """The call each listed step is on, from its open tool call rows: one query."""
    steps = {item.step_id: item for item in items if item.step_id is not None}
    if not steps:
        return
    open_calls: dict[int, list[Call]] = defaultdict(list)
    rows = (
        ToolCall.objects.filter(step_id__in=list(steps), status__in=_OPEN_CALLS)
        .order_by("step_id", "index")
        .values_list("step_id", "index", "tool", "kind", "status", "attempts", "error")
    )
    for step_id, index, tool, kind, status, attempts, error in rows:
        open_calls[step_id].append(_call(index, tool, kind, status, attempts, error))
    for step_id, item in steps.items():
        item.call = _current(item.state, open_calls.get(step_id, []))


def _call(index: int, tool: str, kind: str, status: str, attempts: Any, error: str) -> Call:
    attempts = attempts if isinstance(attempts, list) else []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    at = last.get("at")
    return Call(
        index=index,
        tool=tool,
        kind=kind,
        status=status,
        attempt=len(attempts),
        running=bool(last.get("started") and not last.get("ended")),
        error=(error or "")[:ERROR_CHARS],
        attempt_at=parse_datetime(at) if isinstance(at, str) else None,
    )


def _current(state: str, calls: list[Call]) -> Call | None:
    """Which of a step's open calls it is on, for its state."""
    for c in calls:
        if state == "approval" and c.status == ToolCallStatus.AWAITING_APPROVAL:
            return c
        if state == "in_doubt" and c.status in (ToolCallStatus.IN_DOUBT, ToolCallStatus.INTENT):
            return c
        if state in ("acting", "stalled") and c.status == ToolCallStatus.INTENT and c.running:
            return c
        if state == "backoff" and c.attempt and c.error:
            return c
    return None
