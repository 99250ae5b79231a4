"""The run page's search form: which of a run's steps match a filter (deep-linkable).

The search itself is the runtime's (agentrun.store.search), shared with the JSON API.
"""

from __future__ import annotations

from typing import Any, cast

from django import forms

from agentrun.models import Run, StepStatus, ToolCall, ToolCallStatus
from agentrun.store.search import FIELDS, KINDS, PHASES, TEXT_MAX_CHARS, matching_steps

__all__ = ["FIELDS", "StepSearchForm"]


def _choices(values: Any, blank: str) -> list[tuple[str, str]]:
    return [("", blank), *((v, v.replace("_", " ")) for v in values if v)]


class StepSearchForm(forms.Form):
    q = forms.CharField(
        required=False,
        max_length=TEXT_MAX_CHARS,
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
