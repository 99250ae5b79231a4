"""The Now page in a real browser with hundreds of steps in flight: it reads, it polls, it keeps up."""

from __future__ import annotations

import pytest

from agentrun.models import Run
from tests.base import make_in_flight, make_people
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WORKERS = ("worker-1.example.internal:4101", "worker-2.example.internal:4102", "gpu-box:77")


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def three_hundred_in_flight() -> Run:
    """300 active runs across three workers and every state; returns the longest-deciding one."""
    oldest = make_in_flight("deciding", 1, worker=WORKERS[0], waited=65)[0]
    for n, worker in enumerate(WORKERS):
        make_in_flight("deciding", 25, worker=worker, waited=2 + n)
        make_in_flight("acting", 50, worker=worker, waited=30 + 10 * n, tools=("search", "notify"))
    make_in_flight("stalled", 4, worker="worker-9.example.internal:666", waited=12)
    make_in_flight("backoff", 30, wake_in=20)
    make_in_flight("approval", 10, tools=("ledger_write",), waited=600)
    make_in_flight("in_doubt", 5, tools=("notify",), waited=3900)
    make_in_flight("queued", 25)
    return oldest


def count_of(page, state: str) -> str:
    return page.inner_text(f"#state-{state} .count")


def test_hundreds_of_steps_in_flight_read_at_a_glance_and_update_live(live_server, browser):
    make_people()
    oldest = three_hundred_in_flight()
    assert Run.objects.count() == 300

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        header = " ".join(page.inner_text("#inflight-counts").split())
        assert header == (
            "76 deciding · 150 on a tool · 30 backoff · 10 approval · 5 in doubt"
            " · 4 stalled · 25 queued"
        )
        page.click("#inflight-counts a")
        page.wait_for_url("**/now/")
        settle(page)
        assert_inert(page)

        assert "275 in flight · 25 queued" in page.inner_text(".now-line")
        assert page.locator("table.matrix tbody tr").count() == 5  # 4 workers and nobody
        assert page.inner_text("table.matrix tfoot").split()[-1] == "300"
        assert count_of(page, "deciding") == "76" and count_of(page, "acting") == "150"
        assert page.locator("#state-acting tbody tr").count() == 50
        assert "and 100 more" in page.inner_text("#state-acting .more")
        assert page.locator("#state-queued tbody tr").count() == 5
        first = page.locator("#state-deciding tbody tr").first.inner_text()
        assert str(oldest.pk)[:8] in first and "1 min" in first
        assert page.locator("#state-in_doubt tbody tr").first.inner_text().count("1 h 0") == 1

        page.screenshot(path="/tmp/now-page.png", full_page=True)
        shot(page, "30-now-300-in-flight")

        # The run finishes: the next poll drops it, without a reload.
        stamp = page.inner_text(".now-line time")
        Run.objects.filter(pk=oldest.pk).update(status="succeeded")
        page.wait_for_function(
            "() => document.querySelector('#state-deciding .count').textContent.trim() === '75'",
            timeout=15_000,
        )
        assert str(oldest.pk)[:8] not in page.inner_text("#state-deciding tbody tr:first-child")
        assert page.inner_text(".now-line time") != stamp
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

        # Drill down: one worker's runs on a tool, every one of them.
        page.click(f"table.matrix tbody tr:has-text('{WORKERS[1]}') td:nth-child(3) a")
        page.wait_for_url("**/now/?worker=*")
        settle(page)
        assert page.locator("section.now-group").count() == 1
        assert page.locator("#state-acting tbody tr").count() == 50
        assert page.locator("#state-acting td.worker").all_inner_texts() == [WORKERS[1]] * 50
        assert_inert(page)

    with page_for(browser, live_server.url, width=390, height=844) as (phone, phone_watch):
        login(phone, "victor")
        phone.goto("/now/")
        settle(phone)
        phone.screenshot(path="/tmp/now-page-390.png", full_page=False)
        shot(phone, "31-now-390px", full_page=False)
        overflow = phone.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than the screen"

    for w in (watch, phone_watch):
        assert w.unexpected_requests() == []
        assert w.errors == []
        assert w.dialogs == []
