"""The event log is append-only."""

import pytest
from django.db import DatabaseError, connection, transaction

from agentrun.audit.events import record_event
from agentrun.models import Event
from tests.base import make_people

pytestmark = pytest.mark.django_db


def test_an_event_names_the_operator_who_acted():
    olga = make_people()["operator"]
    event = record_event(
        "run_cancelled",
        user=olga,
        reason="customer asked",
        payload={"api_key": "sk-abcdefghijklmnopqrstuvwx"},
    )
    assert (event.actor, event.user, event.reason) == ("olga", olga, "customer asked")
    assert event.payload == {"api_key": "[REDACTED]"}


def test_the_model_refuses_to_change_or_delete_an_event():
    event = record_event("note", payload={"n": 1})
    event.payload = {"n": 2}
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    assert Event.objects.get(pk=event.pk).payload == {"n": 1}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE agentrun_event SET kind = 'forged' WHERE id = %s",
        "DELETE FROM agentrun_event WHERE id = %s",
    ],
)
def test_postgresql_refuses_update_and_delete_of_an_event(sql):
    event = record_event("note", payload={"n": 1})
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        cur.execute(sql, [event.pk])
    assert Event.objects.get(pk=event.pk).kind == "note"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_queryset_updates_are_refused_too():
    event = record_event("note")
    with pytest.raises(DatabaseError), transaction.atomic():
        Event.objects.filter(pk=event.pk).update(actor="mallory")
    assert Event.objects.get(pk=event.pk).actor == "system"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_postgresql_refuses_truncate_even_for_the_owner_of_the_table():
    event = record_event("note")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_get_userbyid(relowner) = current_user FROM pg_class WHERE oid = 'agentrun_event'::regclass"
        )
        assert cur.fetchone() == (True,)

    with (
        pytest.raises(DatabaseError, match="append-only: TRUNCATE refused"),
        transaction.atomic(),
        connection.cursor() as cur,
    ):
        cur.execute("TRUNCATE agentrun_event")

    assert Event.objects.filter(pk=event.pk).exists()
