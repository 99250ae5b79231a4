from __future__ import annotations

import json
from typing import Any, cast
from uuid import UUID

from django import forms
from django.db.models import Q, QuerySet

from agentrun.audit import export as audit_export
from agentrun.engine import inflight
from agentrun.lifecycle import labels as run_labels
from agentrun.lifecycle import selection as runs_selection
from agentrun.lifecycle.runids import RunIdError, resolve_run
from agentrun.lifecycle.services import REASON_MAX_LENGTH
from agentrun.models import Event, Run, RunStatus, ToolCall
from agentrun.security import storable
from agentrun.security.storable import check_storable
from debugger.diffs import SnapshotRef, SpecError

SIDE_EFFECT_KINDS = ("write", "hybrid")


def _choices(values: Any, blank: str) -> list[tuple[str, str]]:
    return [("", blank), *((v, v) for v in values if v)]


class DateRangeMixin(forms.Form):
    since = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )

    def date_q(self, field: str) -> Q:
        q = Q()
        if self.cleaned_data.get("since"):
            q &= Q(**{f"{field}__date__gte": self.cleaned_data["since"]})
        if self.cleaned_data.get("until"):
            q &= Q(**{f"{field}__date__lte": self.cleaned_data["until"]})
        return q


class RunFilterForm(DateRangeMixin):
    """The run list's filter. Which runs it selects is agentrun.lifecycle.selection's
    definition, shared with the API and replay batches; the form draws the fields and
    reads what was typed."""

    q = forms.CharField(
        required=False,
        label="Search",
        max_length=200,
        widget=forms.TextInput(
            attrs={"placeholder": "run id, goal or input text", "type": "search"}
        ),
    )
    status = forms.ChoiceField(
        required=False, choices=[("", "any status"), ("active", "active"), *RunStatus.choices]
    )
    agent = forms.ChoiceField(required=False, choices=[])
    # Repeatable (?label=a=b&label=c): every one must match. The page draws its own input.
    label = forms.CharField(required=False, label="Label")
    # ?pinned=1, the runs kept from retention.
    pinned = forms.BooleanField(required=False, label="Pinned only")
    error = forms.CharField(
        required=False,
        label="Error",
        max_length=200,
        widget=forms.TextInput(attrs={"placeholder": "text in the error", "type": "search"}),
    )
    version = forms.CharField(
        required=False,
        label="Version",
        max_length=64,
        widget=forms.TextInput(attrs={"placeholder": "code version", "list": "run-versions"}),
    )
    tool_failed = forms.CharField(
        required=False,
        label="Tool failed",
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "a call to it failed", "list": "run-tools"}),
    )

    # The built-in triage views (the page links to them; a form submit keeps them).
    repeated = forms.IntegerField(required=False, min_value=1, max_value=runs_selection.MAX_HOURS)
    stuck = forms.IntegerField(required=False, min_value=1, max_value=runs_selection.MAX_MINUTES)
    no_worker = forms.BooleanField(required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        agents = Run.objects.order_by("agent").values_list("agent", flat=True).distinct()
        cast(forms.ChoiceField, self.fields["agent"]).choices = _choices(agents, "any agent")
        self.selection: runs_selection.Selection | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors:
            try:
                self.selection = runs_selection.parse(self.query())
            except runs_selection.SelectionError as exc:
                self.add_error(exc.field if exc.field in self.fields else None, str(exc))
        return data

    def query(self) -> dict[str, Any]:
        """The filter as the run list's parameters, without the empty ones: what
        agentrun.lifecycle.selection reads, and what a link to these runs carries."""
        data = self.cleaned_data
        out: dict[str, Any] = {
            name: data[name].strip()
            for name in ("q", "status", "agent", "error", "version", "tool_failed")
            if data.get(name, "").strip()
        }
        if data.get("label"):
            out["label"] = list(data["label"])
        if data.get("pinned"):
            out["pinned"] = "1"
        for name in ("since", "until"):
            if data.get(name):
                out[name] = data[name].isoformat()
        for name in ("repeated", "stuck"):
            if data.get(name):
                out[name] = str(data[name])
        if data.get("no_worker"):
            out["no_worker"] = "1"
        return out

    def filter(self, runs: QuerySet[Run]) -> QuerySet[Run]:
        if not self.is_valid() or self.selection is None:
            return runs.none()
        return self.selection.apply(runs)

    def clean_label(self) -> list[str]:
        """Every ?label= of the query (blank ones ignored), each `key=value` or `key`."""
        given = self.data.getlist("label") if hasattr(self.data, "getlist") else []
        found: list[str] = []
        for text in (t.strip() for t in given):
            if not text or text in found:
                continue
            try:
                run_labels.parse_filter(text)
            except run_labels.InvalidLabels as exc:
                raise forms.ValidationError(str(exc)) from None
            found.append(text)
        return found


class AuditFilterForm(DateRangeMixin):
    user = forms.ChoiceField(required=False, choices=[])
    tool = forms.ChoiceField(required=False, choices=[])
    kind = forms.ChoiceField(required=False, choices=_choices(SIDE_EFFECT_KINDS, "write + hybrid"))
    action = forms.ChoiceField(required=False, choices=[])
    run = forms.CharField(
        required=False,
        max_length=40,
        label="Run id",
        widget=forms.TextInput(attrs={"placeholder": "run id, e.g. 3f2a9c1e"}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        actors = (
            Event.objects.filter(user__isnull=False)
            .order_by("actor")
            .values_list("actor", flat=True)
            .distinct()
        )
        tools = (
            ToolCall.objects.filter(kind__in=SIDE_EFFECT_KINDS)
            .order_by("tool")
            .values_list("tool", flat=True)
            .distinct()
        )
        cast(forms.ChoiceField, self.fields["user"]).choices = _choices(actors, "anyone")
        cast(forms.ChoiceField, self.fields["tool"]).choices = _choices(tools, "any tool")
        kinds = (
            Event.objects.filter(user__isnull=False)
            .order_by("kind")
            .values_list("kind", flat=True)
            .distinct()
        )
        cast(forms.ChoiceField, self.fields["action"]).choices = _choices(kinds, "any action")

    def clean_run(self) -> UUID | None:
        text = self.cleaned_data["run"].strip()
        if not text:
            return None
        try:
            return resolve_run(text).pk
        except RunIdError as exc:
            raise forms.ValidationError(str(exc)) from None

    def actions(self) -> QuerySet[Event]:
        events = Event.objects.filter(user__isnull=False)
        if not self.is_valid():
            return events.none()
        data = self.cleaned_data
        if data["user"]:
            events = events.filter(actor=data["user"])
        if data["tool"]:
            events = events.filter(payload__tool=data["tool"])
        if data["kind"]:
            # An operator action touches a tool only through its payload; kind narrows to calls.
            events = events.filter(payload__tool__in=_tools_of_kind(data["kind"]))
        if data["action"]:
            events = events.filter(kind=data["action"])
        if data["run"]:
            events = events.filter(run_id=data["run"])
        return events.filter(self.date_q("created_at")).order_by("-created_at", "-id")

    def chain_filter(self) -> audit_export.Filter | None:
        """What the chained export holds (every event, the system's too), or None if the
        filters are not valid."""
        if not self.is_valid():
            return None
        data = self.cleaned_data
        since, until = data.get("since"), data.get("until")
        return audit_export.Filter(
            run=data["run"],
            operator=data["user"],
            action=data["action"],
            # The page's days, whole: from the start of the first to the end of the last.
            since=runs_selection.moment(since and since.isoformat(), "since", end=False),
            until=runs_selection.moment(until and until.isoformat(), "until", end=True),
        )

    def calls(self) -> QuerySet[ToolCall]:
        calls = ToolCall.objects.filter(kind__in=SIDE_EFFECT_KINDS).select_related("step")
        if not self.is_valid():
            return calls.none()
        data = self.cleaned_data
        if data["user"]:
            # Side effects a user is answerable for: runs they started or calls they approved.
            calls = calls.filter(
                Q(run__created_by__username=data["user"]) | Q(approval__by=data["user"])
            )
        if data["tool"]:
            calls = calls.filter(tool=data["tool"])
        if data["kind"]:
            calls = calls.filter(kind=data["kind"])
        if data["run"]:
            calls = calls.filter(run_id=data["run"])
        return calls.filter(self.date_q("created_at")).order_by("-created_at", "-id")


def _tools_of_kind(kind: str) -> list[str]:
    return list(ToolCall.objects.filter(kind=kind).values_list("tool", flat=True).distinct())


class NowFilterForm(forms.Form):
    """The Now page's filters: one state, one worker, how many runs per state."""

    state = forms.ChoiceField(
        required=False, choices=[("", "every state"), *((s.key, s.title) for s in inflight.STATES)]
    )
    worker = forms.CharField(
        required=False,
        max_length=100,
        widget=forms.TextInput(
            attrs={"placeholder": f"host:pid, or {inflight.NO_WORKER}", "list": "now-workers"}
        ),
    )
    limit = forms.IntegerField(
        required=False,
        label="Per state",
        min_value=1,
        max_value=inflight.MAX_LIMIT,
        widget=forms.NumberInput(attrs={"placeholder": str(inflight.LIMIT)}),
    )

    def snapshot(self) -> inflight.InFlight:
        """What is in flight, filtered as asked; everything when the filters don't hold."""
        if not self.is_valid():
            return inflight.snapshot()
        data = self.cleaned_data
        return inflight.snapshot(
            worker=data["worker"].strip(),
            state=data["state"],
            limit=data["limit"] or inflight.LIMIT,
        )


class CancelForm(forms.Form):
    reason = forms.CharField(
        required=False,
        max_length=REASON_MAX_LENGTH,
        widget=forms.TextInput(attrs={"placeholder": "reason (recorded in the audit log)"}),
    )


class ApprovalForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    comment = forms.CharField(required=False, max_length=REASON_MAX_LENGTH)
    resolution = forms.ChoiceField(
        required=False, choices=[("", "–"), ("retry", "retry"), ("mark_done", "mark done")]
    )


class DiffForm(forms.Form):
    a = forms.CharField(
        label="From",
        max_length=200,
        widget=forms.TextInput(
            attrs={"placeholder": "<run-id>:<step>:<pre|post>, e.g. 3f2a9c1e:4:post"}
        ),
    )
    b = forms.CharField(
        label="To",
        max_length=200,
        widget=forms.TextInput(
            attrs={"placeholder": "<run-id>:<step>:<pre|post>, e.g. 3f2a9c1e:4:post"}
        ),
    )

    def _ref(self, name: str) -> SnapshotRef:
        try:
            return SnapshotRef.parse(self.cleaned_data[name], find=lambda t: resolve_run(t).pk)
        except SpecError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_a(self) -> SnapshotRef:
        return self._ref("a")

    def clean_b(self) -> SnapshotRef:
        return self._ref("b")


# --- forks ------------------------------------------------------------------------------

#: (value, name, what it does): the replay modes of DESIGN section 6, in words.
FORK_MODES = (
    (
        "sandbox",
        "Sandbox",
        "The LLM and read tools run; write and hybrid tools are never executed (recorded as skipped).",
    ),
    (
        "recorded",
        "Recorded",
        "Reuses the parent's decisions and tool results while the state matches, "
        "marks the first divergence, then goes on in sandbox.",
    ),
    (
        "live",
        "Live",
        "Everything runs for real, write and hybrid tools too, with the fork's own idempotency keys.",
    ),
)


class ForkStateForm(forms.Form):
    """The fork form's state alone: what the page's live check validates."""

    state = forms.CharField(
        strip=False,
        error_messages={
            "required": "The state can't be empty: leave the snapshot's state as it is "
            "to replay it unchanged."
        },
    )

    def clean_state(self) -> Any:
        state = parse_json(self.cleaned_data["state"])
        try:
            check_storable(state, "the state")
        except ValueError as exc:
            raise forms.ValidationError(f"{exc}.", code="text") from None
        return state


class ForkForm(ForkStateForm):
    mode = forms.ChoiceField(
        choices=[(value, name) for value, name, _ in FORK_MODES],
        initial="sandbox",
        error_messages={
            "required": "Choose a replay mode.",
            "invalid_choice": "Choose sandbox, recorded or live (not %(value)s).",
        },
    )
    reason = forms.CharField(required=False, max_length=REASON_MAX_LENGTH)
    confirm_live = forms.BooleanField(required=False)
    # Blank: any worker runs the fork; else only workers of this code version.
    version = forms.CharField(required=False, max_length=64, strip=True)


def parse_json(text: str) -> Any:
    """The value of JSON text by the one JSON policy's rules (agentrun.security.storable:
    no NaN, no 1e999, no integer of over 100 digits); a ValidationError names the line
    and column of a mistake."""
    try:
        return storable.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            "Invalid JSON at line %(line)s, column %(column)s: %(problem)s.",
            code="json",
            params={"line": exc.lineno, "column": exc.colno, "problem": exc.msg},
        ) from None
    except ValueError as exc:
        raise forms.ValidationError(f"Invalid JSON: {exc}.", code="json") from None
    except RecursionError:
        raise forms.ValidationError("Invalid JSON: nested too deeply.", code="json") from None


# --- pins --------------------------------------------------------------


class PinForm(forms.Form):
    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH,
        error_messages={"required": "a pin needs a reason, e.g. the incident it is kept for"},
    )


# --- replay batches ------------------------------------------------------------------

#: (value, name, what it means): where each run of a batch is forked from.
BATCH_STARTS = (
    ("before-failure", "Before its failure", "the pre state of its first failed step"),
    ("start", "From its start", "the pre state of its first step"),
    ("tool", "Before a tool", "the pre state of the step of its first call to this tool"),
    ("step", "At a step", "the pre state of this step number"),
)

# Which form field a batches.BatchError is about ("filter": the run list's, shown above).
BATCH_ERROR_FIELDS = {
    "from": "start_from",
    "mode": "mode",
    "version": "version",
    "name": "name",
    "reason": "reason",
    "max_in_flight": "max_in_flight",
    "confirm_live": "confirm_live",
}


class RefusalMixin(forms.Form):
    def refuse(self, exc: Exception) -> None:
        """A refusal from the runtime (a BatchError), next to the field it is about."""
        name = BATCH_ERROR_FIELDS.get(getattr(exc, "field", ""))
        if name not in self.fields:
            name = None
        message = str(exc)
        message = message[:1].upper() + message[1:]
        if message not in self.errors.get(name or "__all__", []):
            self.add_error(name, message)


class BatchForm(RefusalMixin):
    """A replay batch's options; the runs are the run list's filter, in the page's address.
    What is allowed is agentrun.lifecycle.batches' to say: its BatchError lands on a field."""

    start_from = forms.ChoiceField(
        choices=[(value, name) for value, name, _ in BATCH_STARTS],
        initial="before-failure",
        error_messages={"required": "Choose where each run is forked from."},
    )
    tool = forms.CharField(
        required=False,
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "tool name", "list": "batch-tools"}),
    )
    step = forms.IntegerField(
        required=False,
        min_value=1,
        widget=forms.NumberInput(attrs={"placeholder": "step"}),
    )
    mode = forms.ChoiceField(
        choices=[(value, name) for value, name, _ in FORK_MODES],
        initial="sandbox",
        error_messages={"required": "Choose a replay mode."},
    )
    version = forms.CharField(
        required=False,
        max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "any worker", "list": "batch-versions"}),
    )
    name = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.TextInput(attrs={"placeholder": "e.g. the incident it repairs"}),
    )
    reason = forms.CharField(required=False, max_length=REASON_MAX_LENGTH)
    max_in_flight = forms.IntegerField(required=False, min_value=1, max_value=10_000)
    confirm_live = forms.BooleanField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("start_from")
        if kind == "tool" and not data.get("tool", "").strip():
            self.add_error("tool", "Name the tool: each run is forked before its first call to it.")
        if kind == "step" and data.get("step") is None and "step" not in self.errors:
            self.add_error("step", "Give the step number each run is forked at.")
        return data

    def start(self) -> Any:
        """Where each run is forked from, as agentrun.lifecycle.batches reads it."""
        data = self.cleaned_data
        if data["start_from"] == "tool":
            return {"tool": data["tool"].strip()}
        if data["start_from"] == "step":
            return {"step": data["step"]}
        return data["start_from"]

    def options(self) -> dict[str, Any]:
        """batches.create's keyword arguments, from what was typed."""
        data = self.cleaned_data
        return {
            "mode": data["mode"],
            "version": data["version"].strip() or None,
            "name": data["name"],
            "reason": data["reason"],
            "max_in_flight": data["max_in_flight"],
            "confirm_live": data["confirm_live"],
        }


class PromoteForm(RefusalMixin):
    """Promote a batch: replay live, as a new batch, the runs whose fork succeeded."""

    name = forms.CharField(required=False, max_length=1000)
    reason = forms.CharField(required=False, max_length=REASON_MAX_LENGTH)
    confirm_live = forms.BooleanField(required=False)
