"""A 3,000-step run in headless Chromium: the binned strip, the list's windows, search."""

from __future__ import annotations

import pytest

from debugger import timeline
from tests.base import make_people
from tests.debugger.browser import chromium, login, page_for, settle, shot
from tests.debugger.long_runs import long_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def rows(page) -> list[int]:
    return [
        int(n)
        for n in page.eval_on_selector_all("#step-list .row", "els => els.map(e => e.dataset.n)")
    ]


def test_an_operator_zooms_scrolls_and_searches_a_long_run(live_server, browser):
    people = make_people()
    run = long_run(
        people["operator"], 3000, retried=(1234,), backoff={2500: 7.5}, with_snapshots=True
    )

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{run.pk}/")
        settle(page)
        # Opens on the first retried step; the strip is a fixed number of cells.
        assert page.locator("#step-body").get_attribute("data-step") == "1234"
        assert page.locator("#strip .cell").count() <= timeline.MAX_CELLS
        assert page.locator("#strip .cell.sel").count() == 1
        assert 1234 in rows(page) and len(rows(page)) == timeline.LIST_PAGE
        shot(page, "60-long-run", full_page=False)

        # A cell far away: its worst step opens, and the list moves to it.
        cell = page.locator("#strip .cell[data-lo]").nth(166)  # holds step 2500
        lo, hi = int(cell.get_attribute("data-lo")), int(cell.get_attribute("data-hi"))
        assert lo <= 2500 <= hi
        cell.click()
        page.wait_for_selector("#step-body[data-step='2500']")
        page.wait_for_selector("#step-list .row[data-n='2500']")
        settle(page)
        assert page.url.endswith(f"/runs/{run.pk}/steps/2500/")
        assert page.locator("#step-list .row.sel").get_attribute("data-n") == "2500"
        assert page.locator("#strip .cell.sel").get_attribute("data-lo") == str(lo)
        shot(page, "61-long-run-zoomed", full_page=False)

        # The keyboard goes on from there.
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#step-body[data-step='2501']")
        # The list marks the new step once htmx settles the swap (a few ms after it).
        page.wait_for_selector("#step-list .row.sel[data-n='2501']")
        assert page.locator("#step-list .row.sel").count() == 1

        # Scrolling the list to its end loads the next rows; "earlier steps" the previous.
        before = rows(page)
        page.eval_on_selector("#step-list", "el => { el.scrollTop = el.scrollHeight; }")
        page.wait_for_function(
            f"() => document.querySelector('#step-list .row[data-n=\"{before[-1] + 1}\"]')"
        )
        settle(page)
        page.eval_on_selector("#step-list", "el => { el.scrollTop = 0; }")
        page.click("#step-list .more:has-text('earlier steps')")
        page.wait_for_function(
            f"() => document.querySelector('#step-list .row[data-n=\"{before[0] - 1}\"]')"
        )
        settle(page)
        loaded = rows(page)
        assert loaded == list(range(loaded[0], loaded[-1] + 1))  # in order, none twice
        assert len(loaded) >= len(before) + 2
        shot(page, "62-long-run-scrolled", full_page=False)

        # Search: the list and the strip narrow in place, and the URL says so.
        page.fill("#run-search input[name=q]", "value-2777")
        page.press("#run-search input[name=q]", "Enter")
        page.wait_for_function("() => document.querySelectorAll('#step-list .row').length === 1")
        settle(page)
        assert rows(page) == [2777]
        assert "q=value-2777" in page.url
        lit = page.locator("#strip .cell:not(.dim)")
        assert lit.count() == 1
        assert int(lit.get_attribute("data-lo")) <= 2777 <= int(lit.get_attribute("data-hi"))
        shot(page, "63-long-run-search", full_page=False)

        # A filter by tool, from the select; then the deep link of the search reloads it.
        page.fill("#run-search input[name=q]", "")
        page.select_option("#run-search select[name=tool]", "ledger_write")
        page.wait_for_function("() => document.querySelectorAll('#step-list .row').length > 1")
        settle(page)
        assert all(n % 10 == 0 for n in rows(page))
        page.goto(page.url)
        assert all(n % 10 == 0 for n in rows(page)) and rows(page)
        assert page.input_value("#run-search select[name=tool]") == "ledger_write"
        shot(page, "64-long-run-tool-filter", full_page=False)

    assert watch.dialogs == []
    assert watch.unexpected_requests() == []
    assert watch.errors == [], watch.errors[:5]
