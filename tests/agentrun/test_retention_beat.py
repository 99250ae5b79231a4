"""The purge runs on Celery beat, in a real worker process, with the configured retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from agentrun.celery import app
from agentrun.models import Event, Run, Snapshot
from tests.base import calls, drive, final, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

READS = script(calls({"tool": "echo", "args": {"n": 1}}), final())


def test_beat_schedules_the_purge_task_that_the_worker_knows():
    entry = settings.CELERY_BEAT_SCHEDULE["purge"]
    assert entry == {"task": "agentrun.purge", "schedule": settings.AGENTRUN_PURGE_EVERY}
    app.loader.import_default_modules()
    assert "agentrun.purge" in app.tasks


def test_a_worker_with_beat_purges_old_runs_and_keeps_pinned_ones(start_worker):
    old, pinned, recent = (drive(make_run(READS)) for _ in range(3))
    Run.objects.filter(pk__in=(old.pk, pinned.pk)).update(
        finished_at=timezone.now() - timedelta(days=2)
    )
    Run.objects.filter(pk=pinned.pk).update(pinned_at=timezone.now(), pin_reason="incident")
    start_worker(beat=True, AGENTRUN_RETENTION_DAYS="1", AGENTRUN_PURGE_EVERY="1")
    wait_until(
        lambda: Run.objects.filter(pk=old.pk, purge_done=True).exists(),
        timeout=60,
        what="beat's purge to take the old run",
    )
    assert not Snapshot.objects.filter(run=old).exists()
    assert (
        Snapshot.objects.filter(run=pinned).count()
        == Snapshot.objects.filter(run=recent).count()
        == 4
    )
    # The pass records what it did once it is over.
    wait_until(
        lambda: Event.objects.filter(kind="runs_purged", actor="retention").exists(),
        timeout=30,
        what="the pass's event",
    )
