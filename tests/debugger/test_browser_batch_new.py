"""From the run list to a batch in a real browser: filter the runs an incident hit, "Replay
these runs", preview (in place, by htmx) which runs fork from where, create the batch."""

from __future__ import annotations

import pytest

from agentrun.models import ReplayBatch, Run
from tests.base import make_people
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot
from tests.fleet.scenario import deploy_v2, incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_previews_and_creates_a_batch_from_the_run_lists_filter(
    live_server, browser, on_v1, monkeypatch
):
    make_people()
    incident()
    deploy_v2(monkeypatch)

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto("/?agent=refunds")
        settle(page)
        assert page.locator("table.runs tbody tr").count() == 5
        assert page.locator("table.runs td.ver").all_inner_texts() == ["v1"] * 5
        page.fill("input[name=error]", "division by zero")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/?*error=division*")
        assert page.locator("table.runs tbody tr").count() == 3
        shot(page, "92-run-list-versions")

        page.click("[data-action=replay-batch]")
        page.wait_for_url("**/batches/new/?*")
        settle(page)
        assert_inert(page)
        assert page.inner_text(".matching") == "3 runs"
        page.fill("input[name=version]", "v2")
        page.fill("input[name=name]", "refunds INC-7")
        page.click("[data-action=preview]")
        page.wait_for_selector("#batch-preview")
        settle(page)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        assert page.inner_text(".preview-count") == "3 runs to fork"
        assert page.locator(".preview-runs tbody tr").count() == 3
        assert page.locator(".preview-runs a:has-text('step 2')").count() == 3
        assert page.input_value("input[name=name]") == "refunds INC-7"  # kept across the swap
        assert ReplayBatch.objects.count() == 0
        shot(page, "93-batch-new-preview")

        page.click("[data-action=create]")
        page.wait_for_url("**/batches/*-*/")
        batch = ReplayBatch.objects.get()
        assert page.url.endswith(f"/batches/{batch.pk}/")
        assert "Batch refunds INC-7 created" in page.inner_text(".flash")
        assert (batch.version, batch.items.count()) == ("v2", 3)
        assert batch.selection == {"agent": "refunds", "error": "division by zero"}
        assert_inert(page)

    with page_for(browser, live_server.url, width=390, height=844) as (phone, phone_watch):
        login(phone, "olga")
        phone.goto("/?agent=refunds&status=failed")
        settle(phone)
        shot(phone, "94-run-list-390px", full_page=False)
        phone.goto("/batches/new/?agent=refunds")
        phone.click("label.mode-card.mode-live")
        phone.click("[data-action=preview]")
        phone.wait_for_selector("#batch-live-effects")
        settle(phone)
        assert "skipped: no failed step" in phone.inner_text(".preview-runs")
        shot(phone, "95-batch-new-390px", full_page=True)
        overflow = phone.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than the screen"
        assert Run.objects.filter(batch__isnull=False).count() == 0

    for w in (watch, phone_watch):
        assert w.unexpected_requests() == []
        assert w.errors == []
        assert w.dialogs == []
