"""The audit page says whether the event log's chains hold, and which event breaks them."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from agentrun.lifecycle import services
from agentrun.models import Event
from tests.base import as_owner, make_people
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_the_audit_page_shows_the_chains_verified_then_the_broken_event(live_server, browser):
    people = make_people()
    runs.walkthrough_run(people["operator"])
    queued = runs.queued_run(people["operator"])
    services.cancel_run(queued, user=people["operator"], reason="duplicate order")
    cache.clear()

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto("/audit/")
        page.wait_for_selector("#audit-badge .chain-ok")
        settle(page)
        count = Event.objects.count()
        assert f"chains verified · {count} events" in page.locator("#audit-badge").inner_text()
        assert (
            page.locator("a", has_text="Chain JSON lines")
            .get_attribute("href")
            .startswith("/audit/chain.jsonl")
        )
        shot(page, "90-audit-chains-verified", full_page=False)

        cancelled = Event.objects.get(kind="run_cancelled")
        as_owner("UPDATE agentrun_event SET reason = 'as planned' WHERE id = %s", [cancelled.pk])
        cache.clear()
        page.goto("/audit/")
        page.wait_for_selector("#audit-badge .chain-broken")
        settle(page)
        badge = page.locator("#audit-badge").inner_text()
        assert f"chain broken at event {cancelled.pk}" in badge
        assert "operator, position" in badge and "a field was changed" in badge
        shot(page, "91-audit-chain-broken", full_page=False)
        assert watch.unexpected_requests() == []
