"""Search within one run: which of its steps match a filter.

The filter comes from the run page's query string (the dashboard's form) or the API. Everything but
the text in the tool calls is decided by one SQL query on the run's rows (the step table
through its (run, number) index, the tool calls through toolcall_run_tool_args, which
answers the call criteria without reading the wide rows). A text is searched for in the
run's call text (arguments and results), for the steps the other criteria left: in a
long finished run's stored index, or read once per process and kept (see
agentrun.store.callsearch and `call_text`). bench/bench_long_run.py has the figures at 10,000
steps.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, Q

from agentrun.models import (
    ACTIVE_STATUSES,
    WAIT_EVENTS,
    Event,
    Run,
    Step,
    StepStatus,
    ToolCall,
)
from agentrun.store import callsearch
from agentrun.store.callsearch import stored_calls

PHASES = ("idle", "planning", "executing", "reflecting", "waiting", "done", "error")
KINDS = ("read", "write", "hybrid")
FIELDS = ("q", "tool", "kind", "call", "status", "phase", "retried", "waits")
TEXT_MAX_CHARS = 200


def matching_steps(
    run: Run,
    *,
    q: str = "",
    tool: str = "",
    kind: str = "",
    call: str = "",
    status: str = "",
    phase: str = "",
    retried: bool = False,
    waits: bool = False,
) -> set[int]:
    # No ordering: the model's would join the run table (and sort) for nothing.
    steps = Step.objects.filter(run=run).order_by()
    if status:
        steps = steps.filter(status=status)
    if phase:
        steps = steps.filter(Q(phase_after=phase) | Q(phase_after="", phase_before=phase))
    if retried:
        steps = steps.filter(attempts__gt=1)
    if waits:
        waited = Event.objects.filter(run=run, kind__in=WAIT_EVENTS, step__isnull=False)
        steps = steps.filter(Q(status=StepStatus.WAITING) | Q(number__in=waited.values("step")))
    call_q = {"tool": tool, "kind": kind, "status": call}
    if any(call_q.values()):  # one call must meet all three
        # Read from the toolcall_run_tool_args index alone (the rows hold the results).
        calls = ToolCall.objects.filter(run=run, **{k: v for k, v in call_q.items() if v})
        steps = steps.filter(pk__in=calls.order_by().values("step_id"))
    if not q:
        return set(steps.values_list("number", flat=True))
    text = q.strip()
    said = (
        Q(decision__thought__icontains=text)
        | Q(decision__rationale__icontains=text)
        | Q(decision__final__icontains=text)
    )
    # One pass over the steps: those whose decision says it, and the others' ids.
    found: set[int] = set()
    candidates: dict[int, int] = {}
    for pk, number, hit in steps.annotate(
        hit=ExpressionWrapper(said, output_field=BooleanField())
    ).values_list("pk", "number", "hit"):
        if hit:
            found.add(number)
        else:
            candidates[pk] = number
    if candidates:
        found |= {candidates[pk] for pk in call_steps_with(run, text) if pk in candidates}
    return found


# --- the text of a run's tool calls ----------------------------------------------------------
#
# Arguments and results, the calls' text (agentrun.store.callsearch). A finished long run has it
# stored as an index that SQL searches. Otherwise a search reads a run's calls once into
# this process's memory (CallText: lower-cased, callsearch's separators between calls and
# between a call's arguments and result) and finds text there with str.find. The entry
# stays valid while the run's (status, next step, purge) and its calls' (count, last step,
# successes) stay the same (callsearch.calls_version: one query on toolcall_run_tool_args);
# while the run is live, a change re-reads only the calls of its last cached step and of
# the steps after it (a step's calls are final once it commits). Bounded by the text's
# size, least recently used out first.


def call_steps_with(run: Run, text: str) -> set[int]:
    """The ids of the run's steps with a call whose arguments or result hold `text`, in
    any case: from this process's copy of the call text, else from the run's stored index,
    else from a copy read now."""
    version = callsearch.calls_version(run)
    cached = _cached(version)
    if cached is None and callsearch.indexable(run):
        found = callsearch.indexed_steps_with(version, text.lower())
        if found is not None:
            return found
        callsearch.request(run, version)  # none yet, imported, a lost message, stale
    return (cached or call_text(run, version)).steps_with(text)


@dataclass
class CallText:
    """A run's tool calls as one lower-cased text, and the step of each call in it."""

    version: tuple[Any, ...] = ()
    live: bool = False  # read while the run was active
    text: str = ""
    starts: list[int] = field(default_factory=list)  # where each call begins in text
    steps: list[int] = field(default_factory=list)  # its step's id, in order

    def updated(self, version: tuple[Any, ...], live: bool, from_step_id: int) -> CallText:
        """This text without the calls of steps from `from_step_id` on, then theirs as stored now."""
        keep = bisect.bisect_left(self.steps, from_step_id)
        end = self.starts[keep] - 1 if keep < len(self.starts) else len(self.text)
        parts = [self.text[:end]] if keep else []
        starts, steps = self.starts[:keep], self.steps[:keep]
        at = end + 1 if keep else 0
        for step_id, args, result in stored_calls(version[0], from_step_id):
            part = callsearch.call_part(args, result)
            starts.append(at)
            steps.append(step_id)
            parts.append(part)
            at += len(part) + 1
        return CallText(version, live, callsearch.CALL_SEP.join(parts), starts, steps)

    def steps_with(self, text: str) -> set[int]:
        """The step ids with a call whose arguments or result hold `text`, in any case."""
        needle = text.lower()
        found: set[int] = set()
        if not callsearch.searchable(needle):
            return found
        hay, starts = self.text, self.starts
        i = hay.find(needle)
        while i != -1:
            k = bisect.bisect_right(starts, i) - 1
            found.add(self.steps[k])
            if k + 1 >= len(starts):
                break
            i = hay.find(needle, starts[k + 1])  # this call is a match: on to the next
        return found


_TEXTS: OrderedDict[str, CallText] = OrderedDict()
_TEXTS_LOCK = threading.Lock()


def _cached(version: tuple[Any, ...]) -> CallText | None:
    """This process's copy of the run's call text, if it is of this version."""
    with _TEXTS_LOCK:
        cached = _TEXTS.get(str(version[0]))
        if cached is None or cached.version != version:
            return None
        _TEXTS.move_to_end(str(version[0]))
    return cached


def call_text(run: Run, version: tuple[Any, ...] | None = None) -> CallText:
    """The text of the run's tool calls as stored now: from this process's cache when
    nothing changed since it was read, else read again (a live run: its new steps only)."""
    key = str(run.pk)
    version = version or callsearch.calls_version(run)
    with _TEXTS_LOCK:
        cached = _TEXTS.get(key)
        if cached is not None:
            _TEXTS.move_to_end(key)
    if cached is not None and cached.version == version:
        return cached
    live = run.status in ACTIVE_STATUSES
    if cached is not None and cached.live and cached.steps and _grew(cached.version, version):
        out = cached.updated(version, live, cached.steps[-1])
    else:
        out = CallText().updated(version, live, 0)
    _remember(key, out)
    return out


def _grew(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    return new[4] >= old[4] and new[5] >= old[5]


def _remember(key: str, entry: CallText) -> None:
    budget = settings.AGENTRUN_SEARCH_CACHE_MB * 1024 * 1024
    with _TEXTS_LOCK:
        _TEXTS.pop(key, None)
        if len(entry.text) > budget:
            return
        _TEXTS[key] = entry
        while sum(len(e.text) for e in _TEXTS.values()) > budget:
            _TEXTS.popitem(last=False)


def forget_call_texts() -> None:
    """Empty this process's cache of call texts (tests, benchmarks)."""
    with _TEXTS_LOCK:
        _TEXTS.clear()
