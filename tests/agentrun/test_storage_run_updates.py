"""A run's per-step updates touch no indexed column, so PostgreSQL does them in place (HOT)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agentrun.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def hot_and_all_updates():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_stat_get_xact_tuples_hot_updated(c.oid), "
            "pg_stat_get_xact_tuples_updated(c.oid) FROM pg_class c WHERE relname = 'agentrun_run'"
        )
        return cur.fetchone()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates are PostgreSQL's")
def test_claim_and_commit_updates_of_a_run_are_heap_only():
    run = Run.objects.create(agent="scripted", status=RunStatus.RUNNING)
    hot_before, all_before = hot_and_all_updates()
    for n in range(1, 6):
        now = timezone.now()
        claimed = Run.objects.filter(pk=run.pk, next_step=n, status=RunStatus.RUNNING).update(
            lease_owner="w1", lease_expires_at=now + timedelta(seconds=30), updated_at=now
        )
        committed = Run.objects.filter(pk=run.pk, next_step=n, lease_owner="w1").update(
            next_step=n + 1,
            lease_owner="",
            lease_expires_at=None,
            phase="acting",
            status=RunStatus.RUNNING,
            updated_at=now,
        )
        assert claimed == committed == 1
    hot, updates = hot_and_all_updates()
    assert updates - all_before == 10
    assert hot - hot_before == 10


@pytest.mark.skipif(connection.vendor != "postgresql", reason="fillfactor is PostgreSQL's")
def test_the_run_table_leaves_room_on_its_pages_for_new_row_versions():
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = 'agentrun_run'")
        assert "fillfactor=80" in cur.fetchone()[0]
