"""An operator keeps an incident run from retention on its page; a viewer sees it pinned."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.lifecycle import retention
from agentrun.models import Event, Run, ToolCall
from tests.base import make_people
from tests.debugger import runs
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REASON = "incident #123: refund sent twice"


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_pins_a_run_from_its_page(live_server, browser, settings):
    settings.AGENTRUN_RETENTION_DAYS = 30
    people = make_people()
    run = runs.walkthrough_run(people["operator"])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{run.pk}/")
        assert "Purged after" in page.locator("#retention").inner_text()
        # An empty reason is refused by the browser before anything is sent.
        page.click("#retention [data-action=pin]")
        missing = "document.querySelector('#retention input[name=reason]').validity.valueMissing"
        assert page.evaluate(missing)
        assert Run.objects.get(pk=run.pk).pinned_at is None
        shot(page, "69-run-retention", full_page=False)

        page.fill("#retention input[name=reason]", REASON)
        page.click("#retention [data-action=pin]")
        page.wait_for_selector("#retention.pinned")
        settle(page)
        text = page.locator("#retention").inner_text()
        assert f"Kept: {REASON}" in text and "by olga" in text
        assert "Pinned: retention keeps this run" in page.content()
        assert page.is_visible("#retention [data-action=unpin]")
        shot(page, "70-run-pinned", full_page=False)
        assert_inert(page)

        page.goto("/?pinned=1")
        assert page.locator("#run-rows tr").count() == 1
        assert page.locator("#run-rows .badge.pin").count() == 1
        assert page.is_checked("input[name=pinned]")
        shot(page, "71-runs-pinned-filter", full_page=False)

        page.goto("/audit/")
        row = page.locator("#audit-actions tr", has_text="run_pinned")
        assert REASON in row.inner_text()
        assert watch.unexpected_requests() == [] and watch.errors == [] and watch.dialogs == []

    run.refresh_from_db()
    assert (run.pin_reason, run.pinned_by) == (REASON, people["operator"])
    assert Event.objects.filter(run=run, kind="run_pinned", actor="olga").count() == 1

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{run.pk}/")
        assert f"Kept: {REASON}" in page.locator("#retention").inner_text()
        assert page.locator("#retention form").count() == 0
        assert watch.errors == []


def test_a_purged_run_page_shows_what_the_audit_kept(live_server, browser):
    people = make_people()
    failed = runs.failing_run(people["admin"])
    Run.objects.filter(pk=failed.pk).update(finished_at=timezone.now() - timedelta(days=40))
    assert retention.purge(timedelta(days=30)).runs == 1
    key = ToolCall.objects.get(run=failed, tool="reserve").idempotency_key

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{failed.pk}/")
        assert "Retention purged this run" in page.inner_text(".purged-note")
        assert key in page.content()
        assert page.locator("#retention .badge.purged").count() == 1
        assert page.locator("#retention form").count() == 0
        shot(page, "72-run-purged")
        assert_inert(page)
        assert watch.unexpected_requests() == [] and watch.errors == []
