"""Search within one run: which of its steps match a filter.

The filter is a form over the run page's query string (deep-linkable). Everything but
the tool results is decided by one SQL query on the run's rows (the step table through
its (run, number) index, the tool calls through toolcall_run_search, which answers the
call criteria without reading the wide rows). Results are stored zlib-compressed, so
no SQL can look inside them: a text is searched for in the run's result text, read
once per process and kept (see `result_text`), only for the steps the other criteria
left. See bench/bench_long_run.py for the figures at 10,000 steps.
"""

from __future__ import annotations

import bisect
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, cast

from django import forms
from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Q, TextField
from django.db.models.functions import Cast

from agentrun.models import (
    ACTIVE_STATUSES,
    Event,
    Run,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
)
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
        # Read from the toolcall_run_search index alone (the rows hold the results).
        calls = ToolCall.objects.filter(run=run, **{k: v for k, v in call_q.items() if v})
        steps = steps.filter(pk__in=calls.order_by().values("step_id"))
    if not q:
        return set(steps.values_list("number", flat=True))
    text = q.strip()
    in_sql = set(
        steps.filter(
            Q(decision__thought__icontains=text)
            | Q(decision__rationale__icontains=text)
            | Q(decision__final__icontains=text)
            | Q(
                pk__in=ToolCall.objects.filter(run=run)
                .order_by()
                .alias(args_text=Cast("args", TextField()))
                .filter(args_text__icontains=text)
                .values("step_id")
            )
        ).values_list("number", flat=True)
    )
    candidates = dict(steps.exclude(number__in=in_sql).values_list("pk", "number"))
    if not candidates:
        return in_sql
    found = result_text(run).steps_with(text)
    return in_sql | {candidates[pk] for pk in found if pk in candidates}


# --- the text of a run's tool results ------------------------------------------------------
#
# Results are stored zlib-compressed, so SQL cannot look inside them: a search reads a
# run's results once, decompressed, into this process's memory (ASCII letters folded
# to lower case, one NUL between two results: stored JSON text never holds a raw NUL)
# and finds text there with bytes.find. The entry stays valid while the run's
# (status, next step, purge) and its calls' (count, last step) stay the same, checked
# by one query on toolcall_run_search; while the run is live, a change re-reads only
# the results of its last cached step and of the steps after it (a step's results are
# final once it commits). Bounded by the text's bytes, least recently used out first.


def stored_results(run_id: Any, from_step_id: int = 0) -> list[tuple[int, bytes]]:
    """(step id, result as UTF-8 JSON text) of a run's calls with a result, of the steps
    with an id from `from_step_id` on, by step: the one place that reads the stored form
    of ToolCall.result (models.CompressedJSONField) behind the field's back."""
    table = ToolCall._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT step_id, result FROM {table} "  # noqa: S608 - table name from the model
            "WHERE run_id = %s AND result IS NOT NULL AND step_id >= %s ORDER BY step_id, id",
            [run_id.hex if connection.vendor == "sqlite" else run_id, from_step_id],
        )
        rows = cursor.fetchall()
    return [(step_id, zlib.decompress(blob)) for step_id, blob in rows]


@dataclass
class ResultText:
    """A run's tool results as one lower-cased text, and the step of each part."""

    version: tuple[Any, ...] = ()
    live: bool = False  # read while the run was active
    text: bytes = b""
    starts: list[int] = field(default_factory=list)  # where each result begins in text
    steps: list[int] = field(default_factory=list)  # its step's id, in order

    def updated(self, version: tuple[Any, ...], live: bool, from_step_id: int) -> ResultText:
        """This text without the results of steps from `from_step_id` on, then theirs as stored now."""
        keep = bisect.bisect_left(self.steps, from_step_id)
        end = self.starts[keep] - 1 if keep < len(self.starts) else len(self.text)
        parts = [self.text[:end]] if keep else []
        starts, steps = self.starts[:keep], self.steps[:keep]
        at = end + 1 if keep else 0
        for step_id, raw in stored_results(version[0], from_step_id):
            starts.append(at)
            steps.append(step_id)
            parts.append(raw.lower())
            at += len(raw) + 1
        return ResultText(version, live, b"\x00".join(parts), starts, steps)

    def steps_with(self, text: str) -> set[int]:
        """The step ids with a result that holds `text` (ASCII letters in any case)."""
        needle = text.encode("utf-8", "surrogatepass").lower()
        found: set[int] = set()
        if not needle or b"\x00" in needle:
            return found
        hay, starts = self.text, self.starts
        i = hay.find(needle)
        while i != -1:
            k = bisect.bisect_right(starts, i) - 1
            found.add(self.steps[k])
            if k + 1 >= len(starts):
                break
            i = hay.find(needle, starts[k + 1])  # this result is a match: on to the next
        return found


_TEXTS: OrderedDict[str, ResultText] = OrderedDict()
_TEXTS_LOCK = threading.Lock()


def result_text(run: Run) -> ResultText:
    """The text of the run's tool results as stored now: from this process's cache when
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
        out = ResultText().updated(version, live, 0)
    _remember(key, out)
    return out


def _grew(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    return new[4] >= old[4] and new[5] >= old[5]


def _remember(key: str, entry: ResultText) -> None:
    budget = settings.AGENTRUN_SEARCH_CACHE_MB * 1024 * 1024
    with _TEXTS_LOCK:
        _TEXTS.pop(key, None)
        if len(entry.text) > budget:
            return
        _TEXTS[key] = entry
        while sum(len(e.text) for e in _TEXTS.values()) > budget:
            _TEXTS.popitem(last=False)


def forget_result_texts() -> None:
    """Empty this process's cache of result texts (tests, benchmarks)."""
    with _TEXTS_LOCK:
        _TEXTS.clear()
