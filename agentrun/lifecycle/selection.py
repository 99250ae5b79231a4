"""Which runs: the run list's filter, one definition for the page, the API and replay batches.

A selection is the run list's query parameters as an object: `q` (a run id or its start, or
text in the input or a label), `status` (a run status, or "active"), `agent`, `label`
(`key=value` or `key`, repeatable: all must match), `pinned`, `since` and `until` (a date,
or a date and time in ISO 8601), `error` (text in the run's error), `version` (the code
version that ran the run's latest step) and `tool_failed` (a call to this tool failed).
Three are for triage, the run list's built-in views: `repeated` (hours: runs that failed in
that many hours with an error at least REPEATED_RUNS of them share), `stuck` (minutes:
runs not ended and unchanged that long) and `no_worker` (runs due to run now that no
worker holds, as agentrun_runs_runnable counts them).
An unknown field or a bad value raises SelectionError naming it: nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from agentrun.engine.versions import InvalidVersion, check_version
from agentrun.lifecycle import labels as run_labels
from agentrun.models import Run, RunLabel, RunStatus, ToolCall, ToolCallStatus

FIELDS = (
    "q",
    "status",
    "agent",
    "label",
    "pinned",
    "since",
    "until",
    "error",
    "version",
    "tool_failed",
    "repeated",
    "stuck",
    "no_worker",
)
TEXT_MAX_LENGTH = 200
#: "Failing repeatedly": this many failed runs of the window share the error.
REPEATED_RUNS = 3
MAX_HOURS = 24 * 30
MAX_MINUTES = 60 * 24 * 30
STATUSES = ("active", *RunStatus.values)


class SelectionError(ValueError):
    """A filter the run list would not take; `field` names the member at fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Selection:
    q: str = ""
    status: str = ""
    agent: str = ""
    label: tuple[str, ...] = ()
    pinned: bool | None = None
    since: datetime | None = None
    until: datetime | None = None
    error: str = ""
    version: str = ""
    tool_failed: str = ""
    repeated: int = 0
    stuck: int = 0
    no_worker: bool | None = None
    given: dict[str, Any] = field(default_factory=dict, compare=False)

    def apply(self, runs: QuerySet) -> QuerySet:
        if self.status == "active":
            runs = runs.active()
        elif self.status:
            runs = runs.filter(status=self.status)
        if self.agent:
            runs = runs.filter(agent=self.agent)
        if self.pinned is not None:
            runs = runs.filter(pinned_at__isnull=not self.pinned)
        if self.since is not None:
            runs = runs.filter(created_at__gte=self.since)
        if self.until is not None:
            runs = runs.filter(created_at__lt=self.until)
        if self.q:
            runs = runs.filter(text_q(self.q))
        if self.error:
            runs = runs.filter(error__icontains=self.error)
        if self.version:
            runs = runs.filter(code_version=self.version)
        if self.tool_failed:
            failed = ToolCall.objects.filter(
                run=OuterRef("pk"), tool=self.tool_failed, status=ToolCallStatus.FAILED
            )
            runs = runs.filter(Exists(failed))
        now = timezone.now()
        if self.repeated:
            since = now - timedelta(hours=self.repeated)
            failed_lately = Run.objects.filter(status=RunStatus.FAILED, finished_at__gte=since)
            shared = (
                failed_lately.exclude(error="")
                .order_by()
                .values("error")
                .annotate(n=Count("id"))
                .filter(n__gte=REPEATED_RUNS)
                .values("error")
            )
            runs = runs.filter(
                status=RunStatus.FAILED, finished_at__gte=since, error__in=Subquery(shared)
            )
        if self.stuck:
            runs = runs.active().filter(updated_at__lt=now - timedelta(minutes=self.stuck))
        if self.no_worker is not None:
            due = Q(pk__in=Run.objects.runnable(now).values("pk")) | Q(
                pk__in=Run.objects.due_backoff(now).values("pk")
            )
            runs = runs.filter(due) if self.no_worker else runs.exclude(due)
        return run_labels.filter_runs(runs, self.label)

    def as_query(self) -> dict[str, Any]:
        """The selection as given, without its empty members (for links and records)."""
        return {k: v for k, v in self.given.items() if v not in ("", None, [], ())}


def text_q(text: str) -> Q:
    """A run whose id is `text` or starts with it, or whose input or a label holds it."""
    text = text.strip()
    try:
        return Q(pk=UUID(text))
    except ValueError:
        pass
    labelled = RunLabel.objects.filter(run=OuterRef("pk")).filter(
        Q(key__icontains=text) | Q(value__icontains=text)
    )
    q = Q(input__icontains=text) | Q(Exists(labelled))
    compact = text.replace("-", "").lower()
    if len(compact) >= 4 and all(c in "0123456789abcdef" for c in compact):
        q |= Q(pk__startswith=text.lower())  # a run id's start, as the pages show it
    return q


def parse(given: Mapping[str, Any] | None) -> Selection:
    """A Selection from the run list's parameters (strings, or JSON values from the API)."""
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise SelectionError("the filter must be an object of the run list's parameters", "filter")
    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise SelectionError(
            f"unknown filter field {unknown[0]!r}; the run list filters by {', '.join(FIELDS)}",
            str(unknown[0]),
        )
    out: dict[str, Any] = {}
    for name in ("q", "agent", "error", "tool_failed"):
        out[name] = _text(given.get(name), name)
    status = _text(given.get("status"), "status")
    if status and status not in STATUSES:
        raise SelectionError(f"status must be one of {', '.join(STATUSES)}", "status")
    out["status"] = status
    version = _text(given.get("version"), "version")
    if version:
        try:
            check_version(version)
        except InvalidVersion as exc:
            raise SelectionError(str(exc), "version") from None
    out["version"] = version
    out["label"] = _labels(given.get("label"))
    out["pinned"] = _flag(given.get("pinned"), "pinned")
    out["since"] = moment(given.get("since"), "since", end=False)
    out["until"] = moment(given.get("until"), "until", end=True)
    out["repeated"] = _count(given.get("repeated"), "repeated", MAX_HOURS, "hours")
    out["stuck"] = _count(given.get("stuck"), "stuck", MAX_MINUTES, "minutes")
    out["no_worker"] = _flag(given.get("no_worker"), "no_worker")
    return Selection(**out, given={k: given[k] for k in FIELDS if k in given})


def _text(value: Any, name: str) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise SelectionError(f"{name} must be text", name)
    if len(value) > TEXT_MAX_LENGTH:
        raise SelectionError(f"{name} is at most {TEXT_MAX_LENGTH} characters", name)
    if "\x00" in value:
        raise SelectionError(f"{name} can't hold a NUL character", name)
    return value.strip()


def _count(value: Any, name: str, most: int, unit: str) -> int:
    """A whole number of `unit` from 1 to `most` (0: not given)."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if value in (None, ""):
        return 0
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise SelectionError(f"{name} must be a number of {unit}", name)
    text = str(value).strip()
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise SelectionError(f"{name} must be a whole number of {unit}, 1 to {most}", name)
    return int(text)


def _labels(value: Any) -> tuple[str, ...]:
    if value in (None, ""):
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise SelectionError("label must be text or a list of texts (key=value or key)", "label")
    found: list[str] = []
    for text in (i.strip() for i in items):
        if not text or text in found:
            continue
        try:
            run_labels.parse_filter(text)
        except run_labels.InvalidLabels as exc:
            raise SelectionError(str(exc), "label") from None
        found.append(text)
    return tuple(found)


def _flag(value: Any, name: str) -> bool | None:
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if value in (None, ""):
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "on", "yes"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "off", "no"):
        return False
    raise SelectionError(f"{name} must be true or false", name)


def moment(value: Any, name: str, *, end: bool) -> datetime | None:
    """A date (the whole day: from its start, or until its end) or an ISO date and time."""
    text = _text(value, name)
    if not text:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            moment = datetime.combine(day, time.min)
            if end:
                moment = datetime.combine(date.fromordinal(day.toordinal() + 1), time.min)
        else:
            moment = datetime.fromisoformat(text)
    except ValueError:
        raise SelectionError(
            f"{name} must be a date (2026-11-29) or a date and time (2026-11-29T08:00:00Z)",
            name,
        ) from None
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_current_timezone())
    try:
        # In UTC: PostgreSQL refuses offsets beyond ±15:59, which ISO text may carry.
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise SelectionError(f"{name} is out of range", name) from None
