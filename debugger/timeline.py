"""What the run detail page reads: a compact timeline of every step, and one step in full.

The timeline must stay cheap for a 1,000-step run: it never loads decisions,
tool results or snapshots, only the few columns each row shows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache, partial
from html import escape  # the stdlib's: same escaping as Django's, without the lazy wrapper
from itertools import starmap
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Min, Q, Sum
from django.db.models.fields.json import KT
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from agentrun.models import (
    WAIT_EVENTS,
    Event,
    Run,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
    WaitReason,
)
from agentrun.store import rawsql
from agentrun.tools import REGISTRY as TOOLS
from debugger import charts
from debugger.formats import ms

THOUGHT_CHARS = 64  # the list shows about 30; the rest is for wide screens
DENSE_STRIP = 60
WAITING_CALLS = (ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.IN_DOUBT)


@dataclass
class Row:
    """One step in the strip and the compact list."""

    number: int
    status: str
    phase: str
    phase_before: str
    attempts: int
    duration_ms: float | None
    state_size: int | None
    thought: str
    tools: list[tuple[str, str, str]] = field(default_factory=list)  # (tool, kind, status)

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    @property
    def failed(self) -> bool:
        return self.status == StepStatus.FAILED

    @property
    def waiting(self) -> bool:
        return self.status == StepStatus.WAITING

    @property
    def title(self) -> str:
        bits = [f"step {self.number}", self.phase or "–"]
        if self.status != StepStatus.SUCCEEDED:
            bits.append(self.status)
        if self.duration_ms is not None:
            bits.append(f"{self.duration_ms:,.0f} ms")
        if self.retried:
            bits.append(f"{self.attempts} attempts")
        return " · ".join(bits)


def rows(run: Run, numbers: list[int] | None = None) -> list[Row]:
    """Rows of the compact list: every step, or only `numbers` (a window of the list)."""
    steps = Step.objects.filter(run=run)
    if numbers is not None:
        steps = steps.filter(number__in=numbers)
    steps = (
        steps.order_by("number")
        .annotate(thought_text=KT("decision__thought"), final_text=KT("decision__final"))
        .values_list(
            "number",
            "status",
            "phase_before",
            "phase_after",
            "attempts",
            "duration_ms",
            "state_size",
            "thought_text",
            "final_text",
        )
    )
    calls = ToolCall.objects.filter(run=run)
    if numbers is not None:  # through toolcall_step_index, not all the run's calls
        calls = ToolCall.objects.filter(
            step_id__in=Step.objects.filter(run=run, number__in=numbers).values("pk")
        )
    tools: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for number, tool, kind, status in calls.order_by("step__number", "index").values_list(
        "step__number", "tool", "kind", "status"
    ):
        tools[number].append((tool, kind, status))
    out = []
    for number, status, before, after, attempts, duration, size, thought, final in steps:
        text = thought or ""
        if final is not None and not text:
            text = f"final: {final}"
        out.append(
            Row(
                number=number,
                status=status,
                phase=after or before or "",
                phase_before=before or "",
                attempts=attempts,
                duration_ms=duration,
                state_size=size,
                thought=text[:THOUGHT_CHARS] + ("…" if len(text) > THOUGHT_CHARS else ""),
                tools=tools.get(number, []),
            )
        )
    return out


def default_step(run: Run, timeline: list[Row]) -> int | None:
    """The step an incident starts from: the failing or waiting one, else the latest."""
    for row in reversed(timeline):
        if row.failed or row.waiting:
            return row.number
    return timeline[-1].number if timeline else None


def chart_points(timeline: list[Row]) -> list[charts.StepPoint]:
    return [charts.StepPoint(r.number, r.duration_ms, r.state_size, r.failed) for r in timeline]


def stats(run: Run) -> dict[str, Any]:
    agg = Step.objects.filter(run=run).aggregate(
        steps=Count("id"),
        total_ms=Sum("duration_ms"),
        slowest_ms=Max("duration_ms"),
        first=Min("number"),
        last=Max("number"),
    )
    agg["calls"] = ToolCall.objects.filter(run=run).count()
    agg["side_effects"] = ToolCall.objects.filter(run=run, kind__in=("write", "hybrid")).count()
    return agg


def version(run: Run) -> str:
    """Changes whenever anything on the run page could: the cheap "nothing changed" test."""
    return f"{run.updated_at.timestamp():.6f}-{run.next_step}-{run.status}"


@dataclass
class CallView:
    call: ToolCall

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return attempts_of(self.call)

    @property
    def duration_ms(self) -> float | None:
        return call_duration_ms(self.call)

    @property
    def waiting(self) -> bool:
        return self.call.status in WAITING_CALLS


@dataclass
class StepView:
    step: Step
    calls: list[CallView]
    events: list[Event]
    snapshots: dict[str, Snapshot]
    prev: int | None
    next: int | None
    waiting_call: ToolCall | None

    @property
    def finished(self) -> bool:
        return self.step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED)

    @property
    def decision(self) -> dict[str, Any]:
        return self.step.decision or {}

    @property
    def llm(self) -> Any:
        return self.decision.get("llm")

    @property
    def size_change(self) -> int | None:
        pre, post = self.snapshots.get("pre"), self.snapshots.get("post")
        return post.size - pre.size if pre and post else None


def step_view(run: Run, step: Step) -> StepView:
    calls = [CallView(c) for c in ToolCall.objects.filter(step=step).order_by("index")]
    if step.status == StepStatus.RUNNING:
        calls = _with_decided_calls(step, calls)
    events = list(Event.objects.filter(run=run, step=step.number).order_by("created_at", "id"))
    seqs = [Snapshot.seq_for(step.number, at) for at in ("pre", "post")]
    # By seq (the unique (run, seq) index), without the model's ordering (a join to the run).
    found = Snapshot.objects.filter(run=run, seq__in=seqs).order_by().defer("data", "paths")
    snaps = {s.at: s for s in found}
    neighbours = Step.objects.filter(run=run)
    prev = neighbours.filter(number__lt=step.number).aggregate(n=Max("number"))["n"]
    nxt = neighbours.filter(number__gt=step.number).aggregate(n=Min("number"))["n"]
    waiting = None
    if run.status == "waiting" and run.wait_reason in (WaitReason.APPROVAL, WaitReason.IN_DOUBT):
        waiting = next((c.call for c in calls if c.waiting), None)
    return StepView(step, calls, events, snaps, prev, nxt, waiting)


def _with_decided_calls(step: Step, calls: list[CallView]) -> list[CallView]:
    """A running step's read calls are recorded when it commits: until then, show the
    ones its decision asks for as planned, from the decision (unsaved, no key yet)."""
    decided = (step.decision or {}).get("calls") or []
    have = {cv.call.index for cv in calls}
    for i, call in enumerate(decided):
        if i in have or not isinstance(call, dict):
            continue
        name = str(call.get("tool", ""))
        kind = TOOLS[name].kind if name in TOOLS else ""
        planned = ToolCall(
            step=step,
            run_id=step.run_id,
            index=i,
            tool=name,
            kind=kind,
            args=call.get("args") or {},
            status=ToolCallStatus.PLANNED,
        )
        calls.append(CallView(planned))
    return sorted(calls, key=lambda cv: cv.call.index)


def waiting_call(run: Run) -> ToolCall | None:
    """The call an operator must decide on, when the run waits for one."""
    if run.status != "waiting" or run.wait_reason not in (WaitReason.APPROVAL, WaitReason.IN_DOUBT):
        return None
    return (
        ToolCall.objects.filter(run=run, status__in=WAITING_CALLS)
        .select_related("step")
        .order_by("-step__number", "index")
        .first()
    )


def attempts_of(call: ToolCall) -> list[dict[str, Any]]:
    """Attempts with their duration and backoff, in order, for the template."""
    out = []
    for n, a in enumerate(call.attempts or [], start=1):
        at = a.get("at")
        out.append(
            {
                "n": n,
                "at": parse_datetime(at) if isinstance(at, str) else None,
                "error": a.get("error"),
                "backoff_s": a.get("backoff_s"),
                "duration_ms": a.get("duration_ms"),
                "fault": a.get("fault"),
                "unfinished": a.get("started") and not a.get("ended"),
            }
        )
    return out


def call_duration_ms(call: ToolCall) -> float | None:
    spent = [a.get("duration_ms") for a in call.attempts or [] if a.get("duration_ms") is not None]
    return sum(spent) if spent else None


def elapsed(run: Run) -> Any:
    if not run.started_at:
        return None
    return (run.finished_at or timezone.now()) - run.started_at


# --- the strip and the compact list, as HTML ---------------------------------------
# A 1,000-step run has 2,000 of these elements: built here, about 20x faster than
# template loops. Every value that comes from a run goes through escape().


def _step_classes(row: Row) -> str:
    marks = [("failed", row.failed), ("waiting", row.waiting), ("retried", row.retried)]
    return " ".join([f"ph-{_css(row.phase)}", *(name for name, on in marks if on)])


@lru_cache(maxsize=256)
def _css(value: str) -> str:
    return "".join(c for c in value.lower() if c.isalnum() or c in "-_")[:40] or "none"


def strip_html(rows: list[Row], step_url: str, selected: int | None) -> SafeString:
    """One <a class="cell"> per step, coloured by phase, marked failed/waiting/retried."""
    parts = []
    dense = len(rows) > DENSE_STRIP  # cells too narrow for their number
    for r in rows:
        sel = " sel" if r.number == selected else ""
        label = "" if dense else f"<span>{r.number}</span>"
        parts.append(
            f'<a href="{step_url}{r.number}/" data-n="{r.number}" class="cell {_step_classes(r)}{sel}" '
            f'title="{escape(r.title)}">{label}</a>'
        )
    return mark_safe("".join(parts))  # noqa: S308 - escaped above


def list_html(rows: list[Row], step_url: str, selected: int | None) -> SafeString:
    """The compact step list: number, phase, thought, tool chips, duration."""

    parts = []
    for r in rows:
        state = (
            (" sel" if r.number == selected else "")
            + (" failed" if r.failed else "")
            + (" waiting" if r.waiting else "")
        )
        chips = "".join(
            f'<span class="chip kind-{_css(kind)} cs-{_css(status)}" title="{escape(kind)} · {escape(status)}">'
            f"{escape(tool)}</span>"
            for tool, kind, status in r.tools
        )
        retry = (
            f'<span class="retry" title="{r.attempts} attempts">↻{r.attempts}</span> '
            if r.retried
            else ""
        )
        parts.append(
            f'<a href="{step_url}{r.number}/" data-n="{r.number}" class="row{state}">'
            f'<span class="n">{r.number}</span><span class="dot ph-{_css(r.phase)}"></span>'
            f'<span class="thought" hx-disable>{escape(r.thought)}</span><span class="tools">{chips}</span>'
            f'<span class="dur">{retry}{escape(ms(r.duration_ms))}</span></a>'
        )
    return mark_safe("".join(parts))  # noqa: S308 - escaped above


# --- the run page at scale (10,000 steps): marks, a binned strip, a windowed list -------
# The page reads every step's few small columns (no decision, no result) and draws at
# most MAX_CELLS strip cells and CHART_COLUMNS chart bars; the list holds a window of
# rows around the selected step and loads more as it scrolls. So its HTML stays about
# the same size whatever the run's length.

MAX_CELLS = 200  # strip cells at most: beyond, steps are binned
LIST_ALL = 150  # a run (or a search) with this many steps or fewer lists all of them
LIST_PAGE = 100  # rows per window or page of the list
LIST_BEFORE = 30  # rows of the window above the selected step

# Bits of Mark.did: what a step did, for the strip's colour.
DID_READ, DID_WRITE, DID_HYBRID, DID_ANSWER = 1, 2, 4, 8
KIND_BITS = {"read": DID_READ, "write": DID_WRITE, "hybrid": DID_HYBRID}
# Events that mean a step waited: a backoff (tool retry, rate limit, crash) or an operator.
BACKOFF_EVENTS = {"retry_scheduled": "backoff_s", "step_crashed": "retry_in_s"}

# The strip's colour for a group of steps, worst first; after these, the phase.
SEVERITY = ("failed", "retried", "waiting", "answer", "hybrid", "write", "read")


@dataclass(slots=True)
class Mark:
    """One step, as small as the strip and the charts need it."""

    number: int
    status: str
    phase: str
    attempts: int
    duration_ms: float | None
    state_size: int | None
    wall_ms: float | None  # first claim to commit (or to now): work, backoff and waits
    did: int = 0
    backoff_ms: float = 0.0
    waited: bool = False  # a wait event: backoff, rate limit, crash, approval, in doubt

    @property
    def rank(self) -> int:
        """The severity's place in SEVERITY; len(SEVERITY) for none (what `severity`
        says, without its string work: the strip ranks every step of the run)."""
        if self.status == StepStatus.FAILED:
            return 0
        if self.attempts > 1:
            return 1
        if self.status == StepStatus.WAITING:
            return 2
        return _DID_RANKS[self.did]

    @property
    def failed(self) -> bool:
        return self.status == StepStatus.FAILED

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    @property
    def severity(self) -> str:
        """The first of SEVERITY that applies, else "" (coloured by phase)."""
        if self.failed:
            return "failed"
        if self.retried:
            return "retried"
        if self.status == StepStatus.WAITING:
            return "waiting"
        if self.did & DID_ANSWER:
            return "answer"
        for name, bit in (("hybrid", DID_HYBRID), ("write", DID_WRITE), ("read", DID_READ)):
            if self.did & bit:
                return name
        return ""


def _did_rank(did: int) -> int:
    """The rank of a step that did not fail, retry or wait: by what it did."""
    names = (
        ("answer", DID_ANSWER),
        ("hybrid", DID_HYBRID),
        ("write", DID_WRITE),
        ("read", DID_READ),
    )
    return next((SEVERITY.index(name) for name, bit in names if did & bit), len(SEVERITY))


_DID_RANKS = tuple(_did_rank(did) for did in range(16))


@lru_cache(maxsize=2)
def _marks_sql(vendor: str) -> str:
    """One row per step of a run, in order, as Mark takes it: (number, status, phase,
    attempts, duration_ms, state_size, wall_ms, did). The database does the per-step work
    (10,000 rows converted or joined in Python cost more than the rest of the page): the
    wall time from the first claim to the commit, and what the step did, from its calls
    (grouped by step and joined) and its answer. Parameters: the run's id, twice."""
    step, call = rawsql.table(Step), rawsql.table(ToolCall)
    s = partial(rawsql.column, Step)
    c = partial(rawsql.column, ToolCall)
    finished, started = f"s.{s('finished_at')}", f"s.{s('started_at')}"
    if vendor == "postgresql":
        wall = f"CAST(EXTRACT(EPOCH FROM ({finished} - {started})) * 1000 AS double precision)"
    else:
        wall = f"((julianday({finished}) - julianday({started})) * 86400000.0)"
    bits = " + ".join(
        f"MAX(CASE WHEN {c('kind')} = '{kind}' THEN {bit} ELSE 0 END)"
        for kind, bit in KIND_BITS.items()
    )
    answer = (
        f"CASE WHEN s.{s('phase_after')} = 'done' AND s.{s('status')} = "
        f"'{StepStatus.SUCCEEDED.value}' THEN {DID_ANSWER} ELSE 0 END"
    )
    return (
        f"SELECT s.{s('number')}, s.{s('status')}, "  # noqa: S608 - names from the models
        f"COALESCE(NULLIF(s.{s('phase_after')}, ''), NULLIF(s.{s('phase_before')}, ''), ''), "
        f"s.{s('attempts')}, s.{s('duration_ms')}, s.{s('state_size')}, {wall}, "
        f"COALESCE(d.did, 0) + {answer} "
        f"FROM {step} s LEFT JOIN (SELECT {c('step')} AS step_id, {bits} AS did FROM {call} "
        f"WHERE {c('run')} = %s GROUP BY {c('step')}) d ON d.step_id = s.{s('id')} "
        f"WHERE s.{s('run')} = %s ORDER BY s.{s('number')}"
    )


class Marks(list[Mark]):
    """The run's steps in order, with its tool call counts."""

    calls = 0
    side_effects = 0
    moving = False  # a step still open: its wall time counts to now

    def stats(self) -> dict[str, Any]:
        """What stats(run) says, from what marks() read already."""
        durations = [m.duration_ms for m in self if m.duration_ms is not None]
        return {
            "steps": len(self),
            "total_ms": sum(durations) if durations else None,
            "slowest_ms": max(durations, default=None),
            "first": self[0].number if self else None,
            "last": self[-1].number if self else None,
            "calls": self.calls,
            "side_effects": self.side_effects,
        }


SIDE_EFFECT_KINDS = ("write", "hybrid")


# The marks of finished long runs, kept by this process: a run page, each search of it
# and each page of its step list read all of its steps again (28 ms at 10,000 steps),
# and a finished run's steps no longer change. An entry is keyed by the run's version
# (what the page itself polls) and its newest step id: a run deleted and imported again
# under its id has new step ids. A run being purged, or purged, is read each time (a
# purge deletes steps without touching what the key holds). Bounded by the steps held;
# least recently used out first.
_MARKS: OrderedDict[tuple[str, str, int], Marks] = OrderedDict()
_MARKS_LOCK = threading.Lock()
#: Runs with fewer steps are read each time (cheap), and so are runs with more than
#: the cache holds in all.
MARKS_CACHED_FROM = 500
MARKS_CACHE_STEPS = 50_000


def marks(run: Run) -> Marks:
    """Every step of the run, in order (see `read_marks`); a finished run's from this
    process's cache when nothing changed since it was read. The marks are shared: no
    caller changes them."""
    few = run.next_step - run.first_step < MARKS_CACHED_FROM
    if run.is_active or run.purged_at is not None or few:
        return read_marks(run)
    newest = Step.objects.filter(run=run).aggregate(top=Max("pk"))["top"] or 0
    key = (str(run.pk), version(run), newest)
    with _MARKS_LOCK:
        found = _MARKS.get(key)
        if found is not None:
            _MARKS.move_to_end(key)
            return found
    out = read_marks(run)
    if MARKS_CACHED_FROM <= len(out) <= MARKS_CACHE_STEPS and not out.moving:
        with _MARKS_LOCK:
            for old in [k for k in _MARKS if k[0] == key[0]]:
                del _MARKS[old]
            _MARKS[key] = out
            held = sum(len(m) for m in _MARKS.values())
            while held > MARKS_CACHE_STEPS:
                held -= len(_MARKS.popitem(last=False)[1])
    return out


def forget_marks() -> None:
    """Empty this process's cache of marks (tests, benchmarks)."""
    with _MARKS_LOCK:
        _MARKS.clear()


def read_marks(run: Run) -> Marks:
    """Every step of the run, in order: one query of a row per step (`_marks_sql`, read
    raw: Django's per-row conversions cost more than the query at 10,000 rows) and a few
    cheap ones on indexed columns."""
    now = timezone.now()
    run_id = rawsql.prep(Step, "run", run.pk)
    rows = rawsql.fetch_all(_marks_sql(connection.vendor), [run_id, run_id], binary=True)
    out = Marks(starmap(Mark, rows))
    # Still running or waiting: the wall time counts to now.
    open_statuses = (StepStatus.RUNNING.value, StepStatus.WAITING.value)
    unfinished = {m.number: m for m in out if m.wall_ms is None and m.status in open_statuses}
    if unfinished:
        started = Step.objects.filter(run=run, number__in=list(unfinished))
        for number, at in started.values_list("number", "started_at"):
            unfinished[number].wall_ms = (now - at).total_seconds() * 1000
    out.moving = bool(unfinished)
    calls = ToolCall.objects.filter(run=run).order_by()
    counts = calls.aggregate(n=Count("*"), side=Count("pk", filter=Q(kind__in=SIDE_EFFECT_KINDS)))
    out.calls, out.side_effects = counts["n"], counts["side"]
    waits = list(
        Event.objects.filter(run=run, kind__in=WAIT_EVENTS, step__isnull=False).values_list(
            "step", "kind", "payload"
        )
    )
    numbered = {m.number: m for m in out} if waits else {}
    for number, kind, payload in waits:
        mark = numbered.get(number)
        if mark is None:
            continue
        mark.waited = True
        seconds = (payload or {}).get(BACKOFF_EVENTS.get(kind, ""))
        if isinstance(seconds, (int, float)) and seconds > 0:
            mark.backoff_ms += float(seconds) * 1000
    return out


def opening_step(run: Run, all_marks: list[Mark]) -> int | None:
    """Where a run page opens: the first failed step, else the step the run waits on (an
    operator must act), else the first retried one, else (a fork) its first step that
    diverged from its parent, else the last."""
    failed, waiting = StepStatus.FAILED.value, StepStatus.WAITING.value
    first_waiting = first_retried = None
    for m in all_marks:  # one pass: a 10,000-step run usually has none of the three
        if m.status == failed:
            return m.number
        if first_waiting is None and m.status == waiting:
            first_waiting = m.number
        if first_retried is None and m.attempts > 1:
            first_retried = m.number
    hit = first_waiting if first_waiting is not None else first_retried
    if hit is not None:
        return hit
    if run.parent_id:
        diverged = first_divergence(run)
        if diverged is not None and any(m.number == diverged for m in all_marks):
            return diverged
    return all_marks[-1].number if all_marks else None


def first_divergence(run: Run) -> int | None:
    """A fork's first own step whose post state differs from its parent's at that step:
    the engine's record (recorded mode), else by content hash."""
    if run.divergence_step is not None or not run.parent_id:
        return run.divergence_step
    hashes = dict(
        Snapshot.objects.filter(run_id=run.parent_id, at="post", step__gte=run.first_step)
        .order_by("step")
        .values_list("step", "hash")
    )
    for step, h in (
        Snapshot.objects.filter(run=run, at="post").order_by("step").values_list("step", "hash")
    ):
        if hashes.get(step) != h:
            return step
    return None


@dataclass
class Cell:
    """A strip cell: one step, or a bin of consecutive steps."""

    lo: int
    hi: int
    count: int
    severity: str
    phase: str
    pick: int  # the step a click opens: the bin's worst (or first matching) one
    counts: dict[str, int]
    matches: int | None  # steps the search matched in the cell; None: no search


def cells(all_marks: list[Mark], matches: set[int] | None = None) -> list[Cell]:
    """At most MAX_CELLS cells over the run, each coloured by its worst step."""
    size = max(1, -(-len(all_marks) // MAX_CELLS))
    ranks = [m.rank for m in all_marks]
    out = []
    for i in range(0, len(all_marks), size):
        group = range(i, min(i + size, len(all_marks)))
        counts = {"failed": 0, "retried": 0, "waiting": 0}
        for j in group:
            rank = ranks[j]
            if rank < 3:  # failed, retried and waiting are counted in the cell's title
                counts[SEVERITY[rank]] += 1
        hits = (
            [j for j in group if all_marks[j].number in matches] if matches is not None else group
        )
        worst = all_marks[min(hits or group, key=ranks.__getitem__)]
        out.append(
            Cell(
                lo=all_marks[group[0]].number,
                hi=all_marks[group[-1]].number,
                count=len(group),
                severity=worst.severity,
                phase=worst.phase,
                pick=worst.number,
                counts=counts,
                matches=len(hits) if matches is not None else None,
            )
        )
    return out


def cells_html(
    cell_list: list[Cell], step_url: str, selected: int | None, binned: bool
) -> SafeString:
    """The strip. One step per cell: as before (its number, phase colour, marks); bins:
    a range each, coloured by SEVERITY, with a title that counts what is inside."""
    parts = []
    for c in cell_list:
        sel = " sel" if selected is not None and c.lo <= selected <= c.hi else ""
        dim = " dim" if c.matches == 0 else ""
        if not binned:
            marks_on = [n for n in ("failed", "waiting", "retried") if c.counts.get(n)]
            classes = " ".join([f"ph-{_css(c.phase)}", *marks_on])
            label = "" if len(cell_list) > DENSE_STRIP else f"<span>{c.lo}</span>"
            title = f"step {c.lo} · {c.phase or '–'}" + "".join(f" · {n}" for n in marks_on)
            parts.append(
                f'<a href="{step_url}{c.lo}/" data-n="{c.lo}" class="cell {classes}{sel}{dim}" '
                f'title="{escape(title)}">{label}</a>'
            )
            continue
        bits = [f"steps {c.lo}–{c.hi}"]
        bits += [f"{n} {name}" for name, n in c.counts.items() if n]
        if c.matches is not None:
            bits.append(f"{c.matches} matching")
        tone = f"k-{c.severity}" if c.severity else f"ph-{_css(c.phase)}"
        parts.append(
            f'<a href="{step_url}{c.pick}/" data-lo="{c.lo}" data-hi="{c.hi}" '
            f'class="cell bin {tone}{sel}{dim}" title="{escape(" · ".join(bits))}"></a>'
        )
    return mark_safe("".join(parts))  # noqa: S308 - numbers and escaped text only


@dataclass
class Window:
    """Which of the listed steps the page holds: numbers[start:end]."""

    numbers: list[int]
    start: int
    end: int

    @property
    def shown(self) -> list[int]:
        return self.numbers[self.start : self.end]

    @property
    def before(self) -> int | None:
        """The first shown step, when earlier ones are left out (the "load earlier" cue)."""
        return self.numbers[self.start] if self.start > 0 else None

    @property
    def after(self) -> int | None:
        return self.numbers[self.end - 1] if self.end < len(self.numbers) else None


def window(numbers: list[int], around: int | None) -> Window:
    """All of a short list; for a long one, LIST_PAGE rows with `around` near the top."""
    if len(numbers) <= LIST_ALL:
        return Window(numbers, 0, len(numbers))
    if around is None:
        at = len(numbers) - 1
    else:
        from bisect import bisect_left

        at = min(bisect_left(numbers, around), len(numbers) - 1)
    start = max(0, min(at - LIST_BEFORE, len(numbers) - LIST_PAGE))
    return Window(numbers, start, min(len(numbers), start + LIST_PAGE))


def page_after(numbers: list[int], after: int) -> Window:
    from bisect import bisect_right

    start = bisect_right(numbers, after)
    return Window(numbers, start, min(len(numbers), start + LIST_PAGE))


def page_before(numbers: list[int], before: int) -> Window:
    from bisect import bisect_left

    end = bisect_left(numbers, before)
    return Window(numbers, max(0, end - LIST_PAGE), end)


def chart_points_of(all_marks: list[Mark]) -> list[charts.StepPoint]:
    """Per step (or, for a long run, per chart column: its slowest step): the work, the
    backoff (retry delays, rate limits, crashes) and the rest of its wall time (approval,
    an operator, the queue) as their own segments."""
    size = max(1, -(-len(all_marks) // charts.COLUMNS))
    points = []
    failed = StepStatus.FAILED.value
    for i in range(0, len(all_marks), size):
        group = all_marks[i : i + size]
        m, slowest, any_failed = group[0], None, False
        for g in group:  # the first of the slowest (wall time or work), as max() would
            key = max(g.wall_ms or 0.0, g.duration_ms or 0.0)
            if slowest is None or key > slowest:
                m, slowest = g, key
            any_failed = any_failed or g.status == failed
        work = m.duration_ms or 0.0
        wall = max(m.wall_ms or 0.0, work)
        backoff = min(m.backoff_ms, wall - work)
        rest = wall - work - backoff
        points.append(
            charts.StepPoint(
                m.number,
                m.duration_ms,
                group[-1].state_size,
                any_failed,
                backoff_ms=backoff,
                wait_ms=rest if rest >= 1.0 else 0.0,  # under 1 ms: the commit's bookkeeping
            )
        )
    return points
