"""Operators cancel a batch and promote one to live from its pages: POSTs that redirect;
the promotion shows what it would write, by tool, and needs the confirmation. Viewers can't."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import batches
from agentrun.models import Event, LedgerEntry, ReplayBatch, Run
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch(on_v1, monkeypatch, people):
    """A sandbox batch onto v2 of the refunds incident's three failed runs, not advanced."""
    incident()
    deploy_v2(monkeypatch)
    return batches.create(
        {"agent": "refunds", "status": "failed"},
        mode="sandbox",
        version="v2",
        name="refunds INC-7",
        user=people["operator"],
    )


def test_an_operator_cancels_a_running_batch_with_a_reason(client_for, batch):
    response = client_for("operator").post(
        f"/batches/{batch.pk}/cancel/", {"reason": "wrong fix"}, follow=True
    )
    assert response.redirect_chain == [(f"/batches/{batch.pk}/", 302)]
    assert b"Batch cancelled" in response.content
    batch.refresh_from_db()
    assert batch.status == "cancelled" and not Run.objects.filter(batch=batch).exists()
    event = Event.objects.get(kind="batch_cancelled")
    assert (event.actor, event.reason) == ("olga", "wrong fix")


def test_cancelling_a_finished_batch_says_why_not(client_for, batch):
    run_batch(batch)
    response = client_for("operator").post(f"/batches/{batch.pk}/cancel/", follow=True)
    assert b"Not cancelled: the batch is done; only a running batch can be cancelled" in (
        response.content
    )


def test_a_viewer_can_neither_cancel_nor_promote(client_for, batch):
    client = client_for("viewer")
    assert client.post(f"/batches/{batch.pk}/cancel/", {"reason": "x"}).status_code == 403
    assert client.get(f"/batches/{batch.pk}/cancel/").status_code in (403, 405)
    run_batch(batch)
    assert client.get(f"/batches/{batch.pk}/promote/").status_code == 403
    post = {"confirm_live": "on"}
    assert client.post(f"/batches/{batch.pk}/promote/", post).status_code == 403
    batch.refresh_from_db()
    assert batch.status == "done" and ReplayBatch.objects.count() == 1


def test_the_promotion_shows_its_side_effects_by_tool_and_needs_the_confirmation(client_for, batch):
    run_batch(batch)
    client = client_for("operator")
    page = client.get(f"/batches/{batch.pk}/promote/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "3 runs to fork</strong>" in html
    assert '<span class="tool">ledger_write</span></td><td class="num">3</td>' in html
    assert 'name="confirm_live"' in html

    refused = client.post(f"/batches/{batch.pk}/promote/", {"reason": "fixed"})
    assert refused.status_code == 400
    assert 'id="batch-error-confirm_live"' in refused.content.decode()
    assert ReplayBatch.objects.count() == 1


def test_a_confirmed_promotion_makes_a_live_batch_and_opens_it(client_for, batch):
    run_batch(batch)
    response = client_for("operator").post(
        f"/batches/{batch.pk}/promote/", {"reason": "v2 fixes it", "confirm_live": "on"}
    )
    live = ReplayBatch.objects.get(promoted_from=batch)
    assert response.status_code == 302 and response["Location"] == f"/batches/{live.pk}/"
    assert (live.mode, live.name, live.version) == ("live", "refunds INC-7 (live)", "v2")
    run_batch(live)
    assert LedgerEntry.objects.filter(run__batch=live).count() == 3  # each refund paid once
    html = client_for("viewer").get(f"/batches/{live.pk}/").content.decode()
    assert f'href="/batches/{batch.pk}/" hx-disable>refunds INC-7</a>' in html  # promoted from


def test_a_running_batch_cant_be_promoted_and_the_page_says_why(client_for, batch):
    response = client_for("operator").get(f"/batches/{batch.pk}/promote/")
    assert response.status_code == 400
    assert b"the batch is still running" in response.content
    assert b'name="confirm_live"' not in response.content
