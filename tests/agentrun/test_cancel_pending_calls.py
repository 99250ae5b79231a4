"""A cancelled run's calls that never started end as cancelled, not pending forever."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.lifecycle import services
from agentrun.models import LedgerEntry, Reservation, ToolCall
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db


@pytest.fixture
def olga():
    return make_people()["operator"]


def waiting_for_approval():
    """Step 1 reads; step 2 asks approval for a payment, then would reserve stock."""
    return drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"q": "invoice"}}),
                calls(
                    {
                        "tool": "ledger_write",
                        "args": {"account": "acme", "amount": 5},
                        "approval": True,
                    },
                    {"tool": "reserve", "args": {"sku": "widget", "qty": 1}},
                ),
                final(),
            )
        )
    )


def statuses(run):
    return {
        tc.tool: tc.status
        for tc in ToolCall.objects.filter(run=run).order_by("step__number", "index")
    }


def test_cancelling_through_the_api_cancels_the_call_awaiting_approval_and_those_after_it(olga):
    run = waiting_for_approval()
    assert statuses(run) == {
        "echo": "ok",
        "ledger_write": "awaiting_approval",
        "reserve": "planned",
    }
    client = Client()
    client.force_login(olga)

    response = client.post(
        f"/api/runs/{run.pk}/cancel", {"reason": "wrong customer"}, content_type="application/json"
    )

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "cancelled"
    assert [tc["status"] for tc in body["steps"][1]["tool_calls"]] == ["cancelled", "cancelled"]
    assert statuses(run) == {"echo": "ok", "ledger_write": "cancelled", "reserve": "cancelled"}
    assert all(
        tc.finished_at is not None for tc in ToolCall.objects.filter(run=run, status="cancelled")
    )


def test_a_call_approved_but_not_started_yet_is_cancelled_and_never_runs(olga):
    run = waiting_for_approval()
    services.decide_approval(run, user=olga, decision="approve")
    assert statuses(run)["ledger_write"] == "planned"

    services.cancel_run(run, user=olga, reason="changed my mind")

    assert statuses(run) == {"echo": "ok", "ledger_write": "cancelled", "reserve": "cancelled"}
    assert drive(run).status == "cancelled"
    assert not LedgerEntry.objects.filter(run=run).exists()
    assert not Reservation.objects.filter(run=run).exists()


def test_calls_that_happened_keep_their_outcome(olga):
    run = drive(
        make_run(
            script(
                calls({"tool": "reserve", "args": {"sku": "widget", "qty": 2}}),
                calls({"tool": "echo", "args": {}, "approval": True}),
                final(),
            )
        )
    )

    services.cancel_run(run, user=olga)

    assert statuses(run) == {"reserve": "compensated", "echo": "cancelled"}
    assert Reservation.objects.get(run=run).released
