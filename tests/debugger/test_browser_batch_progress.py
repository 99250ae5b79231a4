"""A replay batch's progress page in a real browser: verdict counts update live while the
forks run (driven here, in the test), and every verdict row opens its fork-vs-parent compare."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import batches
from agentrun.models import Run
from tests.base import drive, make_people
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot
from tests.fleet.scenario import deploy_v2, incident

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def text_is(page, selector: str, value: str) -> None:
    """Wait (across polls, without a reload) until the element's text is `value`."""
    page.wait_for_function(
        "([s, v]) => document.querySelector(s)?.textContent.trim() === v",
        arg=[selector, value],
        timeout=15_000,
    )


def test_verdict_counts_update_live_and_every_verdict_row_opens_its_compare(
    live_server, browser, on_v1, monkeypatch
):
    people = make_people()
    incident()  # three refunds fail on v1, two succeed
    deploy_v2(monkeypatch)
    batch = batches.create(
        {"agent": "refunds"},
        mode="sandbox",
        version="v2",
        name="refunds INC-7",
        reason="division by zero on orders without items",
        user=people["operator"],
    )

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.click("nav.mainnav a:has-text('Batches')")
        page.wait_for_url("**/batches/")
        page.click(f"a[href='/batches/{batch.pk}/']")
        page.wait_for_url(f"**/batches/{batch.pk}/")
        settle(page)
        assert_inert(page)
        assert page.inner_text("#count-pending .n") == "3"
        assert page.inner_text("#count-skipped .n") == "2"
        assert page.inner_text("#verdict-fixed .count") == "0"

        # The forks are made and run here; the page follows, a verdict at a time.
        batches.advance(batch.pk)
        text_is(page, "#count-running .n", "3")
        forks = list(Run.objects.filter(batch=batch).order_by("created_at"))
        for n, fork in enumerate(forks, start=1):
            drive(fork)
            batches.advance(batch.pk)
            text_is(page, "#verdict-fixed .count", str(n))
            text_is(page, "#count-succeeded .n", str(n))
        text_is(page, "#batch-status", "done")
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
        assert page.locator("#batch-live[hx-trigger]").count() == 0  # polling stopped
        settle(page)
        shot(page, "90-batch-progress")

        # The verdict's row: its runs, each a link to the fork against its parent.
        page.click("#verdict-fixed a")
        page.wait_for_url("**/?verdict=fixed#batch-runs")
        links = page.locator("#batch-runs a.verdict-link")
        assert links.count() == 3
        hrefs = links.evaluate_all("links => links.map(a => a.getAttribute('href'))")
        assert sorted(hrefs) == sorted(f"/runs/{f.pk}/compare/" for f in forks)
        for fork in forks:
            page.click(f"#batch-runs a.verdict-link[href='/runs/{fork.pk}/compare/']")
            page.wait_for_url(f"**/runs/{fork.pk}/compare/")
            heading = page.inner_text("h1")
            assert f"with its parent {str(fork.parent_id)[:8]}" in heading
            assert "parent ran on v1, fork on v2" in page.inner_text("#compare-versions")
            page.go_back()
            page.wait_for_url("**/?verdict=fixed#batch-runs")
        assert_inert(page)

    with page_for(browser, live_server.url, width=390, height=844) as (phone, phone_watch):
        login(phone, "olga")
        phone.goto(f"/batches/{batch.pk}/")
        settle(phone)
        shot(phone, "91-batch-progress-390px", full_page=True)
        overflow = phone.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than the screen"

    for w in (watch, phone_watch):
        assert w.unexpected_requests() == []
        assert w.errors == []
        assert w.dialogs == []
