"""The reconciler: the broker is only a wake-up, so something must notice a lost one.

One pass finds
- runs that could run now but nobody holds (a lost or never-sent message, a
  worker that died and whose lease expired, a backoff that is due),
- failed or cancelled runs with hybrid calls not yet compensated,
and acts on them. Celery beat runs it every AGENTRUN_RECONCILE_EVERY seconds;
`manage.py reconcile` runs one pass.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from agentrun.engine import compensate_run, enqueue
from agentrun.engine.versions import versions_alive
from agentrun.models import Run, RunStatus, ToolCall, ToolCallStatus, WaitReason

log = logging.getLogger(__name__)


def reconcile_once(grace_seconds: float | None = None) -> dict[str, int]:
    """One pass; returns how many runs were re-enqueued and compensated."""
    now = timezone.now()
    # A run queued a moment ago still has its message in flight: leave it be.
    grace = timedelta(
        seconds=grace_seconds if grace_seconds is not None else settings.AGENTRUN_RECONCILE_EVERY
    )
    unleased = Q(lease_expires_at__isnull=True, updated_at__lt=now - grace)
    expired = Q(lease_expires_at__lt=Now())  # by the database's clock, as the claim sees it
    # An imported run (agentrun.lifecycle.archive) is a read-only record: never resumed here.
    local = Run.objects.filter(imported_at__isnull=True)
    stalled = local.filter(status__in=(RunStatus.QUEUED, RunStatus.RUNNING)).filter(
        unleased | expired
    )
    due = local.filter(status=RunStatus.WAITING, wait_reason=WaitReason.BACKOFF, wake_at__lte=now)
    # A run that asks for a code version no live worker runs waits for one (the run page
    # and the Now page say so): its wake-up would only pile up in that version's queue.
    alive = versions_alive()
    enqueued = 0
    rows = ("id", "next_step", "target_version")
    for run_id, next_step, version in list(stalled.values_list(*rows)) + list(
        due.values_list(*rows)
    ):
        if version and version not in alive:
            continue
        enqueue(run_id, next_step, version=version)
        enqueued += 1
    compensated = 0
    to_undo = (
        ToolCall.objects.filter(kind="hybrid", status=ToolCallStatus.OK)
        .filter(run__status__in=(RunStatus.FAILED, RunStatus.CANCELLED))
        .filter(run__imported_at__isnull=True)
        .values_list("run_id", flat=True)
        .distinct()
    )
    for run in Run.objects.filter(pk__in=list(to_undo)):
        compensated += compensate_run(run)
    # A pass that did nothing is routine (every few seconds): DEBUG, not INFO.
    log.log(
        logging.INFO if enqueued or compensated else logging.DEBUG,
        "reconciler: re-enqueued %d run(s), compensated %d call(s)",
        enqueued,
        compensated,
    )
    return {"enqueued": enqueued, "compensated": compensated}
