"""Migration 0021 chains the events written before chains existed, in the order they were
written; every event after it is chained by the database."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.audit import chain
from agentrun.audit.events import record_event
from agentrun.models import AuditHead, Event, Run
from tests.agentrun.migrating import leaves, migrate

BEFORE = [("agentrun", "0020_saved_views_and_webhooks")]
AFTER = [("agentrun", "0021_audit_chain")]


@pytest.mark.django_db(transaction=True)
def test_existing_events_are_chained_in_the_order_they_were_written():
    latest = leaves()
    apps = migrate(BEFORE)
    try:
        OldRun = apps.get_model("agentrun", "Run")
        OldEvent = apps.get_model("agentrun", "Event")
        run = OldRun.objects.create(id=uuid.uuid4(), agent="scripted")
        start = timezone.now() - timedelta(days=3)
        # Written out of id order: the chain follows the times.
        for minutes, kind in [(2, "second"), (1, "first"), (3, "third")]:
            OldEvent.objects.create(
                run=run,
                kind=kind,
                actor="system",
                payload={"b": [1, 2.5], "a": "é"},
                created_at=start + timedelta(minutes=minutes),
            )
        OldEvent.objects.create(kind="runs_purged", actor="retention", created_at=start)
        migrate(AFTER)

        stream = chain.run_stream(run.id)
        chained = list(Event.objects.filter(stream=stream).order_by("seq"))
        assert [e.kind for e in chained] == ["first", "second", "third"]
        assert [e.seq for e in chained] == [1, 2, 3]
        assert AuditHead.objects.get(stream=stream).hash == chained[-1].hash
        assert Event.objects.get(kind="runs_purged").stream == chain.OPERATOR
        assert chain.verify().ok

        # New events follow on the chains the migration made.
        record_event("fourth", run=Run.objects.get(pk=run.id))
        assert Event.objects.get(kind="fourth").seq == 4
        assert chain.verify().ok
    finally:
        migrate(latest)
