"""A reason or comment for the audit trail is at most 2,000 characters, through the API, the
forms and the commands alike: longer is refused with a 400 (a form error, a command error)
and nothing is recorded."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agentrun.lifecycle.services import REASON_MAX_LENGTH
from agentrun.models import Event, Run
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

LONGEST = "r" * REASON_MAX_LENGTH
TOO_LONG = "r" * (REASON_MAX_LENGTH + 1)
HUGE = "r" * (8 * 1024 * 1024)  # within the request body limit (9 MiB)


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["operator"])
    return client


def post(client, url, body):
    return client.post(url, body, content_type="application/json")


def waiting_for_approval() -> Run:
    return drive(
        make_run(
            script(
                calls(
                    {
                        "tool": "ledger_write",
                        "args": {"account": "a", "amount": 5},
                        "approval": True,
                    }
                ),
                final("paid"),
            )
        )
    )


def test_the_limit_is_the_forms():
    assert REASON_MAX_LENGTH == 2000


@pytest.mark.parametrize("reason", [TOO_LONG, HUGE], ids=["2001", "8MiB"])
def test_a_cancel_reason_too_long_is_a_400_and_cancels_nothing(client, reason):
    run = make_run()
    events = Event.objects.count()

    response = post(client, f"/api/runs/{run.pk}/cancel", {"reason": reason})

    assert response.status_code == 400, response.content[:300]
    assert "reason" in response.json()["detail"]
    assert "2000" in response.json()["detail"]
    assert len(response.content) < 2000  # the answer does not quote it back
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert Event.objects.count() == events


def test_the_longest_reason_is_recorded(client):
    run = make_run()
    assert post(client, f"/api/runs/{run.pk}/cancel", {"reason": LONGEST}).status_code == 200
    assert Event.objects.get(run=run, kind="run_cancelled").reason == LONGEST


def test_an_approval_comment_too_long_is_a_400(client):
    run = waiting_for_approval()
    events = Event.objects.count()

    response = post(client, f"/api/runs/{run.pk}/approve", {"decision": "approve", "comment": HUGE})

    assert response.status_code == 400
    assert Run.objects.get(pk=run.pk).wait_reason == "approval"
    assert Event.objects.count() == events


def test_a_fork_reason_too_long_is_a_400(client):
    parent = drive(make_run())
    runs = Run.objects.count()

    response = post(client, f"/api/runs/{parent.pk}/fork", {"step": 1, "reason": HUGE})

    assert response.status_code == 400
    assert Run.objects.count() == runs


def test_a_pin_reason_too_long_is_a_400(client):
    run = drive(make_run())
    response = post(client, f"/api/runs/{run.pk}/pin", {"reason": HUGE})
    assert response.status_code == 400
    assert Run.objects.get(pk=run.pk).pinned_at is None


def test_the_cancel_form_refuses_a_reason_too_long(client):
    run = make_run()
    response = client.post(f"/runs/{run.pk}/cancel/", {"reason": TOO_LONG}, follow=True)
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert b"at most 2000 characters" in response.content


def test_the_fork_command_refuses_a_reason_too_long(people):
    parent = drive(make_run())
    runs = Run.objects.count()
    with pytest.raises(CommandError, match="reason is 2001 characters; at most 2000"):
        call_command(
            "fork", str(parent.pk), "1", "--at", "pre", "--mode", "sandbox", "--reason", TOO_LONG
        )
    assert Run.objects.count() == runs
