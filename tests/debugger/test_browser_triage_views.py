"""The built-in triage views in a real browser: above the run list, with their counts, one
click from the runs failing repeatedly, stuck, or waiting for a worker."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.models import Run
from tests.base import calls, drive, final, make_people, make_run, script
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def failing(message: str) -> Run:
    return drive(make_run(script(calls({"tool": "fail", "args": {"message": message}}), final())))


def test_an_operator_triages_from_the_built_in_views(live_server, browser):
    make_people()
    declined = {str(failing("card declined").pk)[:8] for _ in range(3)}
    failing("out of stock")
    stuck = make_run()
    Run.objects.filter(pk=stuck.pk).update(updated_at=timezone.now() - timedelta(hours=3))
    drive(make_run())

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto("/")
        settle(page)
        views = page.locator(".saved-views .vchip.builtin")
        assert views.count() == 3
        assert [v.inner_text().split("\n")[0].strip() for v in views.all()] == [
            "Failing repeatedly 3",
            "Stuck > 60 min 1",
            "Waiting for a worker 1",
        ]
        shot(page, "run-list-triage-views")

        page.locator(".vchip.builtin a", has_text="Failing repeatedly").click()
        page.wait_for_url(re.compile(r"/\?repeated=24$"))
        settle(page)
        rows = page.locator("#run-rows tr")
        assert rows.count() == 3
        assert {r.inner_text() for r in rows.all()} and all(
            any(short in r.inner_text() for short in declined) for r in rows.all()
        )
        assert page.locator(".vchip.builtin.current").inner_text().startswith("Failing repeatedly")
        shot(page, "run-list-failing-repeatedly")

        page.locator(".vchip.builtin a", has_text="Stuck").click()
        page.wait_for_url(re.compile(r"/\?stuck=60$"))
        settle(page)
        rows = page.locator("#run-rows tr")
        assert rows.count() == 1 and str(stuck.pk)[:8] in rows.inner_text()
        assert not watch.errors, watch.errors
