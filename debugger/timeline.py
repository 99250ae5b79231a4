"""What the run detail page reads: a compact timeline of every step, and one step in full.

The timeline must stay cheap for a 1,000-step run: it never loads decisions,
tool results or snapshots, only the few columns each row shows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from html import escape  # the stdlib's: same escaping as Django's, without the lazy wrapper
from typing import Any

from django.db.models import Count, Max, Min, Sum
from django.db.models.fields.json import KT
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.safestring import SafeString, mark_safe

from agentrun.models import (
    Event,
    Run,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
    WaitReason,
)
from agentrun.tools import REGISTRY as TOOLS
from debugger import charts

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


def rows(run: Run) -> list[Row]:
    steps = (
        Step.objects.filter(run=run)
        .order_by("number")
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
    tools: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for number, tool, kind, status in (
        ToolCall.objects.filter(run=run)
        .order_by("step__number", "index")
        .values_list("step__number", "tool", "kind", "status")
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
    snaps = {s.at: s for s in Snapshot.objects.filter(run=run, step=step.number).defer("data")}
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
    from debugger.templatetags.debugger_tags import ms

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
