"""Search within one run: which of its steps match a filter.

The filter is a form over the run page's query string (deep-linkable). Everything but
the text in the tool calls is decided by one SQL query on the run's rows (the step table
through its (run, number) index, the tool calls through toolcall_run_tool_args, which
answers the call criteria without reading the wide rows). Results are stored
zlib-compressed, so no SQL can look inside them: a text is searched for in the run's
call text (arguments and results), read once per process and kept (see `call_text`),
for the steps the other criteria left. bench/bench_long_run.py has the figures at
10,000 steps.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

from django import forms
from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, Count, ExpressionWrapper, Max, Q

from agentrun.models import (
    ACTIVE_STATUSES,
    Event,
    Run,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
)
from agentrun.snapshots import inflate_results
from debugger.timeline import WAIT_EVENTS

PHASES = ("idle", "planning", "executing", "reflecting", "waiting", "done", "error")
KINDS = ("read", "write", "hybrid")
FIELDS = ("q", "tool", "kind", "call", "status", "phase", "retried", "waits")


def _choices(values: Any, blank: str) -> list[tuple[str, str]]:
    return [("", blank), *((v, v.replace("_", " ")) for v in values if v)]


class StepSearchForm(forms.Form):
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Text",
        widget=forms.TextInput(
            attrs={"type": "search", "placeholder": "thought, rationale, args or result text"}
        ),
    )
    tool = forms.ChoiceField(required=False, choices=[])
    kind = forms.ChoiceField(required=False, choices=_choices(KINDS, "any kind"))
    call = forms.ChoiceField(
        required=False, label="Call status", choices=_choices(ToolCallStatus.values, "any call")
    )
    status = forms.ChoiceField(
        required=False, label="Step status", choices=_choices(StepStatus.values, "any step")
    )
    phase = forms.ChoiceField(required=False, choices=_choices(PHASES, "any phase"))
    retried = forms.BooleanField(required=False, label="attempts > 1")
    waits = forms.BooleanField(required=False, label="waited")

    def __init__(self, run: Run, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        tools = (
            ToolCall.objects.filter(run=run).order_by("tool").values_list("tool", flat=True)
        ).distinct()
        cast(forms.ChoiceField, self.fields["tool"]).choices = _choices(tools, "any tool")

    @property
    def active(self) -> bool:
        """A valid form that asks for something."""
        return self.is_bound and self.is_valid() and any(self.cleaned_data.values())

    def query_string(self) -> str:
        """The filter as a query string (no leading ?), "" when there is none."""
        if not self.active:
            return ""
        from django.utils.http import urlencode

        data = {k: ("1" if v is True else v) for k, v in self.cleaned_data.items() if v}
        return urlencode(data)

    def matches(self) -> set[int]:
        """The step numbers that match every criterion given (computed once)."""
        assert self.active
        if not hasattr(self, "_matches"):
            self._matches = matching_steps(self.run, **self.cleaned_data)
        return self._matches


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
        found |= {candidates[pk] for pk in call_text(run).steps_with(text) if pk in candidates}
    return found


# --- the text of a run's tool calls ----------------------------------------------------------
#
# Arguments and results, the calls' text. Results are stored zlib-compressed, so SQL
# cannot look inside them, and the rows that hold them are wide, so even a scan of the
# arguments reads them: a search reads a run's calls once into this process's memory
# (lower-cased, a NUL between two calls and between a call's arguments and result:
# JSON text never holds a raw NUL) and finds text there with str.find. The entry stays
# valid while the run's (status, next step, purge) and its calls' (count, last step)
# stay the same, checked by one query on toolcall_run_tool_args; while the run is live, a
# change re-reads only the calls of its last cached step and of the steps after it (a
# step's calls are final once it commits). Bounded by the text's size, least recently
# used out first.


def stored_calls(run_id: Any, from_step_id: int = 0) -> list[tuple[int, str, str | None]]:
    """(step id, arguments as JSON text, result as JSON text or None) of a run's calls,
    of the steps with an id from `from_step_id` on, by step: the one place that reads
    ToolCall.result's stored form (models.CompressedJSONField) behind the field's back."""
    table = ToolCall._meta.db_table
    pg = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT step_id, {'args::text' if pg else 'args'}, result FROM {table} "  # noqa: S608 - names from the model
            "WHERE run_id = %s AND step_id >= %s ORDER BY step_id, id",
            [run_id if pg else run_id.hex, from_step_id],
        )
        rows = cursor.fetchall()
    # A read's result is packed against its step's post delta (agentrun.models.pack):
    # inflate_results reads those deltas in one pass of the run's snapshots.
    # A result whose delta a purge took away meanwhile is searched as no result.
    inflated = inflate_results(run_id, [blob for _, _, blob in rows], gone_as_none=True)
    texts = [_decode(text) for text in inflated]
    return [
        (
            step_id,
            args if pg else json.dumps(json.loads(args), ensure_ascii=False),  # as jsonb has it
            text,
        )
        for (step_id, args, _), text in zip(rows, texts, strict=True)
    ]


def _decode(text: bytes | None) -> str | None:
    return None if text is None else text.decode()


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
            part = (args if result is None else f"{args}\x00{result}").lower()
            starts.append(at)
            steps.append(step_id)
            parts.append(part)
            at += len(part) + 1
        return CallText(version, live, "\x00".join(parts), starts, steps)

    def steps_with(self, text: str) -> set[int]:
        """The step ids with a call whose arguments or result hold `text`, in any case."""
        needle = text.lower()
        found: set[int] = set()
        if not needle or "\x00" in needle:
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


def call_text(run: Run) -> CallText:
    """The text of the run's tool calls as stored now: from this process's cache when
    nothing changed since it was read, else read again (a live run: its new steps only)."""
    key = str(run.pk)
    calls = ToolCall.objects.filter(run_id=run.pk).aggregate(n=Count("*"), top=Max("step_id"))
    version = (run.pk, run.status, run.next_step, run.purged_at, calls["n"], calls["top"] or 0)
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
