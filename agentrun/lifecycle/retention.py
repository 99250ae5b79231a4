"""Retention: finished runs' bulk goes, incidents and the audit trail stay.

A purge takes finished runs (succeeded, failed, cancelled) that finished before a
cutoff and deletes their steps, snapshots and read tool calls. What stays:

- the run row itself, marked `purged_at`, so every reference to it (events, forks'
  `parent`, the audit page's links) still resolves and says what happened;
- every event (the log is append-only: the purge never updates or deletes one);
- every write/hybrid tool call with its idempotency key, approval and compensation,
  and the step row it belongs to (what the audit page shows).

Never purged: active runs, pinned runs, every fork ancestor and descendant of a pinned
run, a failed or cancelled run whose hybrid calls still wait for compensation, and a
run with a fork that is not purged yet (a fork's first snapshot reads through its
parent's snapshots). A fork family therefore goes leaves first.

The work happens in bounded statements: each DELETE removes at most
AGENTRUN_PURGE_BATCH rows of one run, in its own short transaction, so no lock is held
for long and no live run's rows are touched. A run is *taken* first (a conditional
UPDATE setting purged_at, which a concurrent pin or fork serialises with); a pass
that dies half-way leaves runs taken but not done, which the next pass finishes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from agentrun.models import (
    TERMINAL_STATUSES,
    Run,
    RunStatus,
    SearchBlock,
    Snapshot,
    Step,
    ToolCall,
    ToolCallStatus,
)

SIDE_EFFECT_KINDS = ("write", "hybrid")
#: Candidate runs looked at per query (each then purged statement by statement).
RUNS_PER_PAGE = 200
#: Runs with no fork family taken in one transaction and deleted by the same statements.
RUNS_PER_GROUP = 50

_DURATION = re.compile(r"^\s*(\d{1,6})\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str) -> timedelta:
    """'30d', '12h', '90m', '45s' as a timedelta; ValueError says what is accepted."""
    found = _DURATION.match(text or "")
    if not found:
        raise ValueError(
            f"{text!r} is not a duration: write a whole number and a unit, "
            "d (days), h (hours), m (minutes) or s (seconds), e.g. 30d or 12h"
        )
    value = timedelta(**{_UNITS[found.group(2)]: int(found.group(1))})
    if not value:
        raise ValueError("the duration must be more than 0")
    return value


def retention() -> timedelta | None:
    """The configured retention period, or None when runs are kept forever."""
    days = settings.AGENTRUN_RETENTION_DAYS
    return timedelta(days=days) if days > 0 else None


# --- what a run page and the API say ------------------------------------------------


def purge_after(run: Run) -> datetime | None:
    """When retention may purge this run at the earliest; None if it is not due ever
    (active, pinned, already purged, retention off). A pinned fork relative can still
    keep it past this time: see kept_by()."""
    period = retention()
    if (
        period is None
        or run.purged_at is not None
        or run.pinned_at is not None
        or run.status not in TERMINAL_STATUSES
        or run.finished_at is None
        or run.imported_at is not None  # imported on purpose, kept
    ):
        return None
    return run.finished_at + period


def kept_by(run: Run) -> Run | None:
    """A pinned fork ancestor or descendant that keeps this run, if there is one."""
    for ancestor in _ancestors(run.parent_id):
        if ancestor["pinned_at"] is not None:
            return Run.objects.get(pk=ancestor["id"])
    frontier = [run.pk]
    seen = {run.pk}
    while frontier:
        children = list(Run.objects.filter(parent_id__in=frontier).values_list("id", "pinned_at"))
        for child_id, pinned_at in children:
            if pinned_at is not None:
                return Run.objects.get(pk=child_id)
        frontier = [c for c, _ in children if c not in seen]
        seen.update(frontier)
    return None


# --- the purge ---------------------------------------------------------------------------


@dataclass
class PurgeReport:
    cutoff: datetime
    dry_run: bool = False
    runs: int = 0
    steps: int = 0
    snapshots: int = 0
    tool_calls: int = 0
    search_blocks: int = 0
    #: Finished, old enough, but kept: a pinned relative, or a fork that is kept.
    kept: int = 0
    #: False when the pass stopped at its time budget with candidates left.
    complete: bool = True
    seconds: float = 0.0
    run_ids: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "runs": self.runs,
            "steps": self.steps,
            "snapshots": self.snapshots,
            "tool_calls": self.tool_calls,
            "search_blocks": self.search_blocks,
            "kept": self.kept,
            "complete": self.complete,
            "seconds": round(self.seconds, 3),
        }


def _compensating() -> Q:
    """A failed or cancelled run whose hybrid calls the reconciler still has to undo."""
    return Q(status__in=(RunStatus.FAILED, RunStatus.CANCELLED)) & Q(
        Exists(
            ToolCall.objects.filter(run_id=OuterRef("pk"), kind="hybrid", status=ToolCallStatus.OK)
        )
    )


def candidates(cutoff: datetime) -> QuerySet[Run]:
    """Runs the purge may take: finished before the cutoff, not pinned, not purged."""
    return Run.objects.filter(
        finished_at__isnull=False,
        purged_at__isnull=True,
        pinned_at__isnull=True,
        finished_at__lt=cutoff,
        status__in=TERMINAL_STATUSES,
        imported_at__isnull=True,  # an imported run was brought in to be kept
    ).exclude(_compensating())


def purge(
    older_than: timedelta | None = None,
    *,
    dry_run: bool = False,
    batch: int | None = None,
    max_seconds: float | None = None,
    now: datetime | None = None,
) -> PurgeReport:
    """Purge the runs that finished more than `older_than` ago (default: the configured
    retention). With dry_run, count what would go and change nothing."""
    older_than = older_than if older_than is not None else retention()
    if older_than is None:
        raise ValueError("retention is off (AGENTRUN_RETENTION_DAYS=0): give older_than")
    started = time.monotonic()
    batch = batch or settings.AGENTRUN_PURGE_BATCH
    report = PurgeReport(cutoff=(now or timezone.now()) - older_than, dry_run=dry_run)
    if not dry_run:
        for run_id in Run.objects.filter(purged_at__isnull=False, purge_done=False).values_list(
            "id", flat=True
        ):
            _delete_rows([run_id], batch, report)
    handled: set[Any] = set()
    ancestors_ok: dict[Any, bool] = {}
    after: tuple[datetime, Any] | None = None
    while True:
        page_qs = candidates(report.cutoff).order_by("finished_at", "id")
        if after is not None:
            page_qs = page_qs.filter(
                Q(finished_at__gt=after[0]) | Q(finished_at=after[0], id__gt=after[1])
            )
        page = list(page_qs.values_list("id", "parent_id", "finished_at")[:RUNS_PER_PAGE])
        if not page:
            break
        after = (page[-1][2], page[-1][0])
        with_forks = set(
            Run.objects.filter(parent_id__in=[p[0] for p in page])
            .values_list("parent_id", flat=True)
            .distinct()
        )
        if not dry_run:
            # Runs with no fork family (nearly all) go in groups: fewer round trips.
            plain = [p[0] for p in page if p[1] is None and p[0] not in with_forks]
            for start in range(0, len(plain), RUNS_PER_GROUP):
                group = plain[start : start + RUNS_PER_GROUP]
                if max_seconds is not None and time.monotonic() - started > max_seconds:
                    report.complete = False
                    report.seconds = time.monotonic() - started
                    return report
                not_taken = set(_take_plain(group, report.cutoff, batch, report))
                handled.update(r for r in group if r not in not_taken)
        for run_id, parent_id, _ in page:
            if run_id in handled:
                continue
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                report.complete = False
                report.seconds = time.monotonic() - started
                return report
            plan = _plan(run_id, parent_id, run_id in with_forks, report.cutoff, ancestors_ok)
            if plan is None:
                report.kept += 1
                continue
            for member in plan:
                handled.add(member)
                if dry_run:
                    _count_rows(member, report)
                elif not _take_and_purge(member, report.cutoff, batch, report):
                    report.kept += 1
                    break  # a fork that stays keeps its ancestors: leave the rest
    report.seconds = time.monotonic() - started
    return report


def _ancestors(parent_id: Any) -> list[dict[str, Any]]:
    chain: list[dict[str, Any]] = []
    seen: set[Any] = set()
    while parent_id is not None and parent_id not in seen:
        seen.add(parent_id)
        row = Run.objects.filter(pk=parent_id).values("id", "parent_id", "pinned_at").first()
        if row is None:
            break
        chain.append(row)
        parent_id = row["parent_id"]
    return chain


def _plan(
    run_id: Any, parent_id: Any, has_forks: bool, cutoff: datetime, ancestors_ok: dict[Any, bool]
) -> list[Any] | None:
    """The runs to purge for this candidate, leaves first, or None if it must stay."""
    if parent_id is not None:
        if parent_id not in ancestors_ok:
            ancestors_ok[parent_id] = all(a["pinned_at"] is None for a in _ancestors(parent_id))
        if not ancestors_ok[parent_id]:
            return None
    if not has_forks:
        return [run_id]
    # Every descendant must go too (or be gone): each reads through its ancestors.
    order: list[Any] = []
    frontier = [run_id]
    seen = {run_id}
    while frontier:
        rows = list(
            Run.objects.filter(parent_id__in=frontier).values(
                "id", "status", "finished_at", "pinned_at", "purge_done"
            )
        )
        for row in rows:
            if row["purge_done"]:
                continue
            if (
                row["pinned_at"] is not None
                or row["status"] not in TERMINAL_STATUSES
                or row["finished_at"] is None
                or row["finished_at"] >= cutoff
            ):
                return None
            order.append(row["id"])
        frontier = [r["id"] for r in rows if r["id"] not in seen]
        seen.update(frontier)
    if order and candidates(cutoff).filter(pk__in=order).count() != len(order):
        return None  # one waits for compensation (or was just pinned or taken)
    # Breadth-first order reversed: every run comes after all of its descendants.
    return [*reversed(order), run_id]


def _take_and_purge(run_id: Any, cutoff: datetime, batch: int, report: PurgeReport) -> bool:
    """Take the run (it must still qualify, with no unpurged fork and no pinned ancestor),
    then delete its rows. False if it no longer qualifies."""
    parent_id = Run.objects.values_list("parent_id", flat=True).get(pk=run_id)
    ancestors = [a["id"] for a in _ancestors(parent_id)]
    with transaction.atomic():
        if ancestors:
            # A pin of an ancestor serialises with this (its UPDATE waits for the lock).
            pins = Run.objects.select_for_update(no_key=True).filter(pk__in=ancestors)
            if any(p is not None for p in pins.values_list("pinned_at", flat=True)):
                return False
        taken = candidates(cutoff).filter(pk=run_id).update(purged_at=timezone.now())
        if taken != 1:
            return False
        # A fork made before we took the row is visible now; one made after sees purged_at.
        if Run.objects.filter(parent_id=run_id, purge_done=False).exists():
            transaction.set_rollback(True)
            return False
    _delete_rows([run_id], batch, report)
    report.runs += 1
    report.run_ids.append(run_id)
    return True


# Plain statements (the tables are agentrun's own): each deletes at most %s rows of the
# runs in RUNS (placeholders, one per run).
STATEMENTS = (
    (
        # The search index holds the results' text: first.
        "search_blocks",
        "DELETE FROM agentrun_searchblock WHERE id IN (SELECT id FROM agentrun_searchblock "
        "WHERE run_id IN (RUNS) LIMIT %s)",
    ),
    (
        "tool_calls",
        "DELETE FROM agentrun_toolcall WHERE id IN (SELECT id FROM agentrun_toolcall "
        "WHERE run_id IN (RUNS) AND kind NOT IN ('write', 'hybrid') LIMIT %s)",
    ),
    (
        "snapshots",
        "DELETE FROM agentrun_snapshot WHERE id IN "
        "(SELECT id FROM agentrun_snapshot WHERE run_id IN (RUNS) LIMIT %s)",
    ),
    (
        # What is left of the calls is the audit's: their steps stay with them.
        "steps",
        "DELETE FROM agentrun_step WHERE id IN (SELECT s.id FROM agentrun_step s "
        "WHERE s.run_id IN (RUNS) AND NOT EXISTS "
        "(SELECT 1 FROM agentrun_toolcall c WHERE c.step_id = s.id) LIMIT %s)",
    ),
)


def _delete_rows(run_ids: list[Any], batch: int, report: PurgeReport) -> None:
    """Delete the taken runs' rows, at most `batch` per statement, each its own transaction."""
    keys = [Run._meta.pk.get_db_prep_value(r, connection) for r in run_ids]  # type: ignore[union-attr]
    runs = ", ".join(["%s"] * len(keys))
    for what, template in STATEMENTS:
        sql = template.replace("RUNS", runs)
        while True:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql, [*keys, batch])
                deleted = cursor.rowcount
            setattr(report, what, getattr(report, what) + deleted)
            if deleted < batch:
                break
    Run.objects.filter(pk__in=run_ids).update(purge_done=True, forked_from=None)


def _take_plain(run_ids: list[Any], cutoff: datetime, batch: int, report: PurgeReport) -> list[Any]:
    """Take and purge runs that are no forks and had no forks, together; returns the ones
    that were not taken after all (a fork appeared, or a pin): they go the careful way."""
    with transaction.atomic():
        # Locked in id order (as every purge does) so two purges can't deadlock; a pin or a
        # fork of one of them waits for this transaction, then sees purged_at.
        locked = list(
            candidates(cutoff)
            .filter(pk__in=run_ids, parent__isnull=True)
            .order_by("pk")
            .select_for_update(no_key=True)
            .values_list("pk", flat=True)
        )
        forked = set(
            Run.objects.filter(parent_id__in=locked, purge_done=False).values_list(
                "parent_id", flat=True
            )
        )
        taken = [r for r in locked if r not in forked]
        Run.objects.filter(pk__in=taken).update(purged_at=timezone.now())
    if taken:
        _delete_rows(taken, batch, report)
        report.runs += len(taken)
        report.run_ids.extend(taken)
    return [r for r in run_ids if r not in set(taken)]


def _count_rows(run_id: Any, report: PurgeReport) -> None:
    report.runs += 1
    report.run_ids.append(run_id)
    report.tool_calls += (
        ToolCall.objects.filter(run_id=run_id).exclude(kind__in=SIDE_EFFECT_KINDS).count()
    )
    report.snapshots += Snapshot.objects.filter(run_id=run_id).count()
    report.search_blocks += SearchBlock.objects.filter(run_id=run_id).count()
    # Read calls go first, so only the steps of side-effecting calls stay.
    report.steps += (
        Step.objects.filter(run_id=run_id)
        .exclude(
            Exists(ToolCall.objects.filter(step_id=OuterRef("pk"), kind__in=SIDE_EFFECT_KINDS))
        )
        .count()
    )


def pass_budget() -> float:
    """Seconds one beat pass works: half the interval, and within the task's time limits
    (and so the broker's redelivery timeout); the next pass goes on where it stopped."""
    return min(settings.AGENTRUN_PURGE_EVERY / 2, settings.AGENTRUN_STEP_TIME_LIMIT * 0.8)


def run_pass() -> dict[str, Any]:
    """What beat runs: one pass with the configured retention, within pass_budget();
    nothing when retention is off."""
    if retention() is None:
        return {"skipped": "retention is off (AGENTRUN_RETENTION_DAYS=0)"}
    report = purge(max_seconds=pass_budget())
    if report.runs:
        record(report, actor="retention")
    return report.as_dict()


def record(report: PurgeReport, *, actor: str) -> None:
    """The purge's event, in the operator stream, with each purged run's chain head
    (position and hash): verification then checks each run's chain still reaches it."""
    from agentrun.audit import chain
    from agentrun.audit.events import record_event

    with transaction.atomic():
        heads = chain.heads_of(report.run_ids)
        record_event(chain.PURGE_KIND, actor=actor, payload={**report.as_dict(), "chains": heads})
