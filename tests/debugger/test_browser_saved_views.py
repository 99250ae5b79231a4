"""Saved views in a real browser: an operator filters the run list, names the filter, and
finds it above the list the next time, one click from the same runs."""

from __future__ import annotations

import re

import pytest

from tests.base import calls, drive, final, make_people, make_run, script
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_saves_a_filter_and_opens_it_from_the_list(live_server, browser):
    make_people()
    declined = drive(make_run(script(calls({"tool": "fail", "args": {"message": "card declined"}}), final())))  # fmt: skip
    drive(make_run(script(calls({"tool": "fail", "args": {"message": "out of stock"}}), final())))
    drive(make_run())

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto("/?status=failed&error=declined")
        settle(page)
        assert page.locator("#run-rows tr").count() == 1
        page.fill(".save-view input[name=name]", "Declined cards")
        page.click("[data-action=save-view]")
        page.wait_for_url(re.compile(r"/\?status=failed&error=declined$"))
        settle(page)
        assert "Saved the view" in page.content()
        chip = page.locator(".saved-views .vchip.current:not(.builtin)")
        assert chip.locator("a").inner_text() == "Declined cards"
        shot(page, "run-list-saved-views")

        page.goto("/")
        settle(page)
        assert page.locator("#run-rows tr").count() == 3
        page.locator(".saved-views .vchip a", has_text="Declined cards").click()
        page.wait_for_url(re.compile(r"/\?status=failed&error=declined$"))
        rows = page.locator("#run-rows tr")
        assert rows.count() == 1 and str(declined.pk)[:8] in rows.inner_text()
        box = page.locator(".saved-views").bounding_box()
        assert box is not None and box["height"] < 60  # one line above the filters

        page.locator(".saved-views .vchip-x").click()
        page.wait_for_url(re.compile(r"/$"))
        assert page.locator(".saved-views .vchip:not(.builtin)").count() == 0
        assert not watch.errors, watch.errors
