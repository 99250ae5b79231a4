"""A replay batch as its pages show it: the counts by state and by verdict, the skip reasons,
the filter that chose its runs, a preview's rows. The numbers are agentrun.lifecycle.batches'."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, QuerySet
from django.urls import reverse
from django.utils.http import urlencode

from agentrun.lifecycle import batches
from agentrun.models import BatchItem, ItemStatus, ReplayBatch, Verdict

PREVIEW_ROWS = 200

#: (verdict, how it reads, what it means): a fork's outcome against its parent's.
VERDICTS = (
    (Verdict.FIXED, "fixed", "the parent failed, the fork succeeded"),
    (Verdict.STILL_FAILING, "still failing", "both failed, with the same error"),
    (Verdict.FAILING_DIFFERENTLY, "failing differently", "the fork failed, not as the parent did"),
    (Verdict.CHANGED_SIDE_EFFECTS, "changed side effects", "the same outcome, other writes"),
    (Verdict.UNCHANGED, "unchanged", "the same outcome, the same writes"),
    (Verdict.CANCELLED, "cancelled", "the fork was cancelled before it ended"),
)
VERDICT_NAMES: dict[str, str] = {str(value): name for value, name, _ in VERDICTS}


@dataclass(frozen=True)
class Tile:
    key: str
    title: str
    n: int


@dataclass(frozen=True)
class VerdictRow:
    verdict: str
    name: str
    meaning: str
    n: int
    percent: int


def tiles(counts: dict[str, dict[str, int]]) -> list[Tile]:
    """The runs of a batch by state: forks created, running, succeeded, failed, ..."""
    runs = counts["runs"]
    created = sum(runs[s] for s in ("running", "succeeded", "failed", "cancelled"))
    return [
        Tile("total", "runs", created + runs["pending"] + runs["skipped"]),
        Tile("pending", "to fork", runs["pending"]),
        Tile("created", "forks created", created),
        Tile("running", "running", runs["running"]),
        Tile("succeeded", "succeeded", runs["succeeded"]),
        Tile("failed", "failed", runs["failed"]),
        Tile("cancelled", "cancelled", runs["cancelled"]),
        Tile("skipped", "skipped", runs["skipped"]),
    ]


def verdict_rows(counts: dict[str, dict[str, int]]) -> list[VerdictRow]:
    judged = sum(counts["verdicts"].values())
    return [
        VerdictRow(
            value,
            name,
            meaning,
            counts["verdicts"].get(value, 0),
            round(100 * counts["verdicts"].get(value, 0) / judged) if judged else 0,
        )
        for value, name, meaning in VERDICTS
    ]


def is_live(batch: ReplayBatch, counts: dict[str, dict[str, int]]) -> bool:
    """Will the page change: the batch makes forks, or one of its forks is still active."""
    return batch.is_active or counts["runs"]["running"] > 0


def items(batch: ReplayBatch, shown: str) -> QuerySet[BatchItem]:
    """The batch's runs in order: all of them, those with one verdict, or the skipped ones."""
    rows = BatchItem.objects.filter(batch=batch).select_related("parent", "fork")
    if shown == "skipped":
        rows = rows.filter(status=ItemStatus.SKIPPED)
    elif shown:
        rows = rows.filter(verdict=shown)
    return rows.order_by("position")


def skip_reasons(batch: ReplayBatch) -> list[tuple[str, int]]:
    rows = (
        BatchItem.objects.filter(batch=batch, status=ItemStatus.SKIPPED)
        .values_list("skip_reason")
        .annotate(n=Count("pk"))
        .order_by("-n", "skip_reason")
    )
    return [(reason, n) for reason, n in rows]


def version_token(batch: ReplayBatch, counts: dict[str, Any], page: list[BatchItem]) -> str:
    """What the page shows, in a few characters: the same token, nothing to redraw."""
    moved = BatchItem.objects.filter(batch=batch, fork__isnull=False).aggregate(
        at=Max("fork__updated_at")
    )["at"]
    parts = [batch.status, repr(sorted(counts["runs"].items())), repr(moved)]
    parts += [f"{i.pk}:{i.status}:{i.verdict}:{i.fork_id}" for i in page]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def filter_parts(query: dict[str, Any]) -> list[tuple[str, str]]:
    """The run list's filter as (field, value) pairs, a label filter each on its own."""
    parts = []
    for name, value in query.items():
        for one in value if isinstance(value, list | tuple) else [value]:
            if one not in ("", None):
                parts.append((name, str(one)))
    return parts


def run_list_url(query: dict[str, Any]) -> str:
    url = reverse("debugger:run-list")
    return f"{url}?{urlencode(query, doseq=True)}" if query else url


def describe_start(start_from: Any) -> str:
    try:
        return batches.parse_from(start_from).describe()
    except batches.BatchError:
        return str(start_from)


@dataclass
class Preview:
    plan: batches.Plan
    rows: list[batches.PlannedRun]
    reasons: list[tuple[str, int]]

    @property
    def side_effect_calls(self) -> int:
        return sum(self.plan.side_effects.values())

    @property
    def more(self) -> int:
        return len(self.plan.items) - len(self.rows)


def preview(plan: batches.Plan) -> Preview:
    reasons = Counter(i.skip_reason for i in plan.items if i.step is None)
    return Preview(plan, plan.items[:PREVIEW_ROWS], reasons.most_common())
