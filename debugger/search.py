"""Search within one run: which of its steps match a filter.

The filter is a form over the run page's query string (deep-linkable). Everything but
the tool results is decided by one SQL query on the run's rows (the step and tool call
tables are reached through their (run, …) indexes). Results are stored zlib-compressed,
so no SQL can look inside them: their text is searched here, decompressed, only for
the steps the other criteria left and only when a text is given. At 10,000 steps this
reads about one compressed result per step (see bench/bench_long_run.py).
"""

from __future__ import annotations

import re
from typing import Any, cast

from django import forms
from django.db import connection
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from agentrun.models import Event, Run, Step, StepStatus, ToolCall, ToolCallStatus, inflate_many
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
    steps = Step.objects.filter(run=run)
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
        calls = ToolCall.objects.filter(run=run, **{k: v for k, v in call_q.items() if v})
        steps = steps.filter(pk__in=calls.values("step_id"))
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
                .alias(args_text=Cast("args", TextField()))
                .filter(args_text__icontains=text)
                .values("step_id")
            )
        ).values_list("number", flat=True)
    )
    candidates = dict(steps.exclude(number__in=in_sql).values_list("pk", "number"))
    return in_sql | _in_results(run, candidates, text)


def _in_results(run: Run, candidates: dict[int, int], text: str) -> set[int]:
    """Steps among `candidates` (step pk → number) with a tool result containing `text`
    (case-insensitive for ASCII letters), read compressed and decompressed here."""
    if not candidates:
        return set()
    # On the stored bytes (UTF-8 JSON text): no decoding, ASCII case folded by the regex.
    needle = re.compile(re.escape(text.encode()), re.IGNORECASE)
    found: set[int] = set()
    table = ToolCall._meta.db_table
    with connection.cursor() as cursor:
        # Raw, so the bytes come back as stored (the field would parse each result).
        cursor.execute(
            f"SELECT step_id, result FROM {table} WHERE run_id = %s AND result IS NOT NULL",  # noqa: S608 - table name from the model
            [run.pk.hex if connection.vendor == "sqlite" else run.pk],
        )
        rows = [(s, blob) for s, blob in cursor if s in candidates]
    # Packed results read their step's delta too (agentrun.models.pack): a query a batch.
    for i in range(0, len(rows), 500):
        batch = [(s, blob) for s, blob in rows[i : i + 500] if s not in found]
        for (step_id, _), text in zip(batch, inflate_many([b for _, b in batch]), strict=True):
            if needle.search(text):
                found.add(step_id)
    return {candidates[pk] for pk in found}
