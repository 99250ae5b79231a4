"""Operator actions through the API: cancel, approve, reject, resolve a call in doubt."""

from __future__ import annotations

import os

import pytest
from django.test import Client

from agentrun import engine
from agentrun.models import Event, OutboxMessage, Reservation, Run
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["operator"])
    return client


def post(client, url, body=None):
    return client.post(url, body if body is not None else {}, content_type="application/json")


def needs_approval(tool="ledger_write", args=None):
    args = args if args is not None else {"account": "acme", "amount": 5}
    return script(calls({"tool": tool, "args": args, "approval": True}), final("paid"))


# --- cancel ---------------------------------------------------------------------


def test_cancelling_a_run_records_who_and_why(client):
    run = make_run()

    response = post(client, f"/api/runs/{run.pk}/cancel", {"reason": "wrong customer"})

    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"]
    event = Event.objects.get(run=run, kind="run_cancelled")
    assert (event.actor, event.reason) == ("olga", "wrong customer")


def test_cancelling_needs_no_body(client):
    run = make_run()
    assert client.generic("POST", f"/api/runs/{run.pk}/cancel").status_code == 200


def test_cancelling_a_finished_run_is_a_409_and_changes_nothing(client):
    run = drive(make_run())
    events = Event.objects.count()

    response = post(client, f"/api/runs/{run.pk}/cancel", {"reason": "late"})

    assert response.status_code == 409
    assert "only an active run can be cancelled" in response.json()["detail"]
    assert Event.objects.count() == events
    run.refresh_from_db()
    assert run.status == "succeeded"


def test_cancelling_a_parked_run_compensates_its_reservations(client):
    run = make_run(
        script(
            calls({"tool": "reserve", "args": {"sku": "widget", "qty": 2}}),
            calls({"tool": "echo", "args": {}, "approval": True}),
            final(),
        )
    )
    drive(run)
    assert run.status == "waiting"

    body = post(client, f"/api/runs/{run.pk}/cancel", {"reason": "stop"}).json()

    assert body["status"] == "cancelled"
    reserve = body["steps"][0]["tool_calls"][0]
    assert reserve["status"] == "compensated"
    assert reserve["compensation"]["status"] == "ok"
    assert reserve["compensation"]["key"] == reserve["idempotency_key"] + ":compensate"
    assert Reservation.objects.get(run=run).released


# --- approve and reject -----------------------------------------------------------


def test_an_approval_parks_the_run_until_an_operator_approves(client):
    run = drive(make_run(needs_approval()))
    detail = client.get(f"/api/runs/{run.pk}").json()
    assert (detail["status"], detail["wait_reason"]) == ("waiting", "approval")
    assert detail["steps"][0]["tool_calls"][0]["status"] == "awaiting_approval"

    response = post(client, f"/api/runs/{run.pk}/approve", {"decision": "approve", "comment": "ok"})

    assert response.status_code == 200
    assert response.json()["status"] == "queued"
    drive(run)
    assert run.status == "succeeded"
    call = client.get(f"/api/runs/{run.pk}").json()["steps"][0]["tool_calls"][0]
    assert call["status"] == "ok"
    assert call["approval"]["decision"] == "approve"
    assert call["approval"]["by"] == "olga"
    ledger = client.get(f"/api/ledger?run={run.pk}").json()
    assert ledger["invocations"] == {call["idempotency_key"]: 1}
    event = Event.objects.get(run=run, kind="approved")
    assert (event.actor, event.reason) == ("olga", "ok")


def test_a_rejected_call_fails_the_run_without_running_it(client):
    run = drive(make_run(needs_approval()))

    response = post(
        client, f"/api/runs/{run.pk}/approve", {"decision": "reject", "comment": "too much"}
    )

    assert response.status_code == 200
    drive(run)
    assert run.status == "failed"
    assert "rejected by olga" in run.error
    assert client.get(f"/api/ledger?run={run.pk}").json()["entries"] == []
    assert Event.objects.filter(run=run, kind="rejected", actor="olga").exists()


def test_approving_a_run_that_is_not_waiting_is_a_409(client):
    run = make_run()
    events = Event.objects.count()

    response = post(client, f"/api/runs/{run.pk}/approve", {"decision": "approve"})

    assert response.status_code == 409
    assert "not waiting" in response.json()["detail"]
    assert Event.objects.count() == events


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"decision": "maybe"},
        {"decision": True},
        {"decision": "approve", "comment": 5},
        {"decision": "approve", "resolution": "forget"},
        {"decision": "approve", "by": "someone else"},
    ],
)
def test_a_bad_decision_is_a_400_and_changes_nothing(client, body):
    run = drive(make_run(needs_approval()))
    events = Event.objects.count()

    response = post(client, f"/api/runs/{run.pk}/approve", body)

    assert response.status_code == 400
    assert response.json()["detail"]
    assert Event.objects.count() == events
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == ("waiting", "approval")


def test_a_viewer_cannot_approve(people):
    run = drive(make_run(needs_approval()))
    viewer = Client()
    viewer.force_login(people["viewer"])

    response = post(viewer, f"/api/runs/{run.pk}/approve", {"decision": "approve"})

    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == "waiting"


# --- a call left in doubt -----------------------------------------------------------


class Crash(BaseException):
    """Stands in for the worker process dying (the engine calls os._exit)."""


def crash_in_doubt(monkeypatch, run):
    """Run step 1 until its non-idempotent `notify` has sent, then die before recording it."""

    def die(code):
        raise Crash(code)

    monkeypatch.setattr(os, "_exit", die)
    with pytest.raises(Crash):
        engine.execute_step(run.pk, 1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=None)  # the dead worker's lease ran out
    return drive(run)


def notify_once():
    return script(
        calls({"tool": "notify", "args": {"to": "ops", "body": "hi"}, "fault": "crash_after"}),
        final(),
    )


def test_a_call_in_doubt_marked_done_is_not_sent_again(client, monkeypatch):
    run = crash_in_doubt(monkeypatch, make_run(notify_once()))
    assert (run.status, run.wait_reason) == ("waiting", "in_doubt")

    response = post(
        client, f"/api/runs/{run.pk}/approve", {"decision": "approve", "resolution": "mark_done"}
    )

    assert response.status_code == 200
    drive(run)
    assert run.status == "succeeded"
    assert OutboxMessage.objects.filter(run=run).count() == 1


def test_a_call_in_doubt_retried_is_sent_again(client, monkeypatch):
    run = crash_in_doubt(monkeypatch, make_run(notify_once()))

    response = post(
        client, f"/api/runs/{run.pk}/approve", {"decision": "approve", "resolution": "retry"}
    )

    assert response.status_code == 200
    drive(run)
    assert run.status == "succeeded"
    assert OutboxMessage.objects.filter(run=run).count() == 2
