"""The new batch page: the run list's filter in its address, the batch's options, a preview
that writes nothing, then the batch. Operators only; bad input is refused next to its field."""

from __future__ import annotations

import pytest

from agentrun.models import Event, ReplayBatch, Run
from tests.debugger.conftest import hx
from tests.fleet.scenario import incident

pytestmark = pytest.mark.django_db

REFUNDS = "/batches/new/?agent=refunds"
FAILED = "/batches/new/?agent=refunds&status=failed"


@pytest.fixture
def five(on_v1, people):
    """Three runs of the refunds agent failed on v1 at step 2, two succeeded."""
    return incident()


def test_a_viewer_may_neither_open_nor_post_it(client_for, five):
    client = client_for("viewer")
    assert client.get(FAILED).status_code == 403
    post = {"start_from": "start", "mode": "sandbox", "name": "x"}
    assert client.post(FAILED, post).status_code == 403
    assert ReplayBatch.objects.count() == 0


def test_it_opens_with_the_run_lists_filter_and_the_default_options(client_for, five):
    response = client_for("operator").get(FAILED)
    assert response.status_code == 200
    assert response.context["matching"] == 3
    html = response.content.decode()
    assert '<span class="fname">agent</span> refunds' in html
    assert '<span class="fname">status</span> failed' in html
    assert 'href="/?status=failed&amp;agent=refunds" data-action="edit-filter"' in html
    assert 'name="start_from" value="before-failure" checked' in html
    assert 'name="mode" value="sandbox" checked' in html
    assert f'action="{FAILED.replace("&", "&amp;")}"' in html  # the filter travels with the post
    assert ReplayBatch.objects.count() == 0


def test_the_preview_gives_each_runs_fork_point_or_why_it_is_skipped_and_writes_nothing(
    client_for, five
):
    failed = [r for r in five if r.status == "failed"]
    client = client_for("operator")
    data = {"start_from": "before-failure", "mode": "sandbox", "preview": "1"}
    page = client.post(REFUNDS, data)
    assert page.status_code == 200
    found = page.context["found"]
    assert (found.plan.count, found.plan.skipped) == (3, 2)
    assert found.reasons == [("no failed step", 2)]
    html = page.content.decode()
    assert "3 runs to fork</strong>" in html and "2 skipped</strong>" in html
    for run in failed:
        assert f'href="/runs/{run.pk}/steps/2/pre/">step 2' in html
    assert html.count("skipped: no failed step") == 2
    assert "<html" in html  # without htmx: the whole page

    fragment = client.post(REFUNDS, data, **hx("batch-form"))
    body = fragment.content.decode()
    assert body.lstrip().startswith('<form id="batch-form"') and "<html" not in body
    assert "3 runs to fork</strong>" in body
    assert ReplayBatch.objects.count() == 0 and Run.objects.count() == 5


def test_a_refused_preview_in_place_is_a_form_htmx_swaps_with_the_error_by_its_field(
    client_for, five
):
    data = {"start_from": "before-failure", "mode": "sandbox", "version": "v 2", "preview": "1"}
    fragment = client_for("operator").post(FAILED, data, **hx("batch-form"))
    assert fragment.status_code == 200  # htmx swaps a 200, not a 400
    body = fragment.content.decode()
    assert body.lstrip().startswith('<form id="batch-form"')
    assert 'id="batch-error-version"' in body and "batch-preview" not in body


def test_a_live_batch_shows_its_side_effects_by_tool_and_needs_the_confirmation(client_for, five):
    client = client_for("operator")
    url = "/batches/new/?agent=refunds&status=succeeded"
    data = {"start_from": "start", "mode": "live", "name": "pay again"}
    refused = client.post(url, data)
    assert refused.status_code == 400
    html = refused.content.decode()
    assert '<span class="tool">ledger_write</span></td><td class="num">2</td>' in html
    assert 'id="batch-error-confirm_live"' in html and "confirm it" in html
    assert ReplayBatch.objects.count() == 0

    created = client.post(url, {**data, "confirm_live": "on"})
    batch = ReplayBatch.objects.get()
    assert created.status_code == 302 and created["Location"] == f"/batches/{batch.pk}/"
    assert batch.mode == "live"


def test_create_makes_the_batch_and_opens_its_page(client_for, people, five):
    response = client_for("operator").post(
        FAILED,
        {
            "start_from": "before-failure",
            "mode": "sandbox",
            "version": "v2",
            "name": "refunds INC-7",
            "reason": "division by zero",
            "max_in_flight": "2",
        },
        follow=True,
    )
    batch = ReplayBatch.objects.get()
    assert response.redirect_chain == [(f"/batches/{batch.pk}/", 302)]
    assert b"Batch refunds INC-7 created" in response.content
    assert (batch.name, batch.version, batch.max_in_flight, batch.mode) == (
        "refunds INC-7",
        "v2",
        2,
        "sandbox",
    )
    assert batch.selection == {"agent": "refunds", "status": "failed"}
    assert batch.items.count() == 3 and batch.created_by == people["operator"]
    assert Event.objects.get(kind="batch_created").reason == "division by zero"


@pytest.mark.parametrize(
    "url, data, field, message",
    [
        (FAILED, {"name": ""}, "name", "A batch needs a name"),
        (FAILED, {"version": "not a version"}, "version", "a version is letters, digits"),
        (FAILED, {"start_from": "tool", "tool": ""}, "tool", "Name the tool"),
        (FAILED, {"start_from": "step", "step": "0"}, "step", "greater than or equal to 1"),
        (FAILED, {"max_in_flight": "0"}, "max_in_flight", "greater than or equal to 1"),
        (FAILED, {"start_from": "tool", "tool": "nope"}, "filter", "no run to replay"),
        ("/batches/new/?agent=refunds&status=bogus", {}, "filter", "The filter is refused"),
        ("/batches/new/?version=v%201", {}, "filter", "Filter version: a version is"),
    ],
)
def test_bad_input_is_refused_next_to_its_field_and_nothing_is_created(
    client_for, five, url, data, field, message
):
    post = {"start_from": "before-failure", "mode": "sandbox", "name": "repair", **data}
    response = client_for("operator").post(url, post)
    assert response.status_code == 400
    html = response.content.decode()
    assert message.lower() in html.lower()
    if field != "filter":
        assert f'id="batch-error-{field}"' in html
    assert ReplayBatch.objects.count() == 0 and Run.objects.count() == 5
