"""Operators cancel, approve and reject from the run page; each is a POST that redirects."""

from __future__ import annotations

import pytest

from agentrun.models import Event, Run, ToolCall
from tests.base import drive
from tests.debugger import runs

pytestmark = pytest.mark.django_db


def test_an_operator_cancels_with_a_reason(client_for, people):
    run = runs.queued_run(people["operator"])
    response = client_for("operator").post(
        f"/runs/{run.pk}/cancel/", {"reason": "duplicate"}, follow=True
    )
    assert response.redirect_chain == [(f"/runs/{run.pk}/", 302)]
    assert b"Run cancelled" in response.content
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    event = Event.objects.get(run=run, kind="run_cancelled")
    assert (event.actor, event.user, event.reason) == ("olga", people["operator"], "duplicate")


def test_cancelling_a_finished_run_explains_why_not(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("operator").post(f"/runs/{run.pk}/cancel/", follow=True)
    assert b"Not cancelled: run is succeeded" in response.content
    assert Run.objects.get(pk=run.pk).status == "succeeded"


def test_an_operator_approves_and_the_run_goes_on(client_for, people):
    run = runs.waiting_run(people["operator"])
    response = client_for("admin").post(
        f"/runs/{run.pk}/approval/",
        {"decision": "approve", "comment": "ok", "next": f"/runs/{run.pk}/steps/2/"},
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/steps/2/"
    assert drive(run).status == "succeeded"
    call = ToolCall.objects.get(run=run, tool="ledger_write")
    assert call.approval["by"] == "ada" and call.status == "ok"


def test_an_operator_rejects_and_the_run_fails(client_for, people):
    run = runs.waiting_run(people["operator"])
    client_for("operator").post(
        f"/runs/{run.pk}/approval/", {"decision": "reject", "comment": "too much"}
    )
    assert drive(run).status == "failed"
    assert Event.objects.get(run=run, kind="rejected").reason == "too much"


def test_a_bad_decision_or_a_run_not_waiting_changes_nothing(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    client = client_for("operator")
    response = client.post(f"/runs/{run.pk}/approval/", {"decision": "maybe"}, follow=True)
    assert b"Choose approve or reject" in response.content
    response = client.post(f"/runs/{run.pk}/approval/", {"decision": "approve"}, follow=True)
    assert b"No decision recorded: run is succeeded" in response.content
    assert not Event.objects.filter(run=run, kind__in=("approved", "rejected")).exists()


def test_next_must_stay_on_this_site(client_for, people):
    run = runs.queued_run(people["operator"])
    response = client_for("operator").post(
        f"/runs/{run.pk}/cancel/", {"next": "https://evil.example/"}
    )
    assert response["Location"] == f"/runs/{run.pk}/"
