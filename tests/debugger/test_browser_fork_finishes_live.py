"""A fork's page left open while a real worker runs the fork: the live refresh leaves it as
a fresh load would (the opening step shown, the search form there), without a reload."""

from __future__ import annotations

import pytest

from agentrun.celery import app as celery_app
from agentrun.models import Run
from tests.base import make_people
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for, settle, shot
from tests.workers import Worker

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# What a page shows: the step opened, the search form, the selected cells, the step's panes.
LOOK = """() => ({
  step: document.querySelector('#step-body')?.getAttribute('data-step') ?? null,
  select_a_step: document.querySelector('#step-body.empty') !== null,
  search_form: document.querySelector('form#run-search') !== null,
  strip_sel: [...document.querySelectorAll('#strip .sel')].map(c => c.getAttribute('data-n')),
  list_sel: [...document.querySelectorAll('#step-list .sel')].map(c => c.getAttribute('data-n')),
  cells: document.querySelectorAll('#strip .cell').length,
  state_pane: document.querySelector('#step-body #snap-pane .diffhead') !== null,
  live: document.querySelector('.live-dot') !== null,
})"""


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_a_fork_that_finishes_while_its_page_is_open_looks_as_after_a_reload(
    live_server, browser, tmp_path, settings
):
    people = make_people()
    parent = runs.walkthrough_run(people["operator"])
    settings.AGENTRUN_ENQUEUE = True
    celery_app.control.purge()
    worker = None
    try:
        with page_for(browser, live_server.url) as (page, watch):
            login(page, "olga")
            page.goto(f"/runs/{parent.pk}/steps/4/pre/fork/")
            page.fill("input[name=reason]", "replay it")
            page.click("[data-action=fork]")
            page.wait_for_selector(".callout.forkinfo")
            fork = Run.objects.get(parent=parent)
            # Queued, no worker yet: no step to open, nothing to search.
            before = page.evaluate(LOOK)
            assert before["select_a_step"] and not before["search_form"] and before["live"]
            # The first steps open one while the fork runs; its end opens the step a load would.
            worker = Worker(tmp_path)  # picks the fork up from the broker
            page.wait_for_selector(".runtitle .badge.st-succeeded", timeout=60_000)
            settle(page)
            page.wait_for_selector("#step-body #snap-pane .diffhead")
            live = page.evaluate(LOOK)
            shot(page, "fork-finished-live")

            page.reload()
            settle(page)
            page.wait_for_selector("#step-body #snap-pane .diffhead")
            fresh = page.evaluate(LOOK)
            assert Run.objects.get(pk=fork.pk).status == "succeeded"
            assert fresh["step"] is not None and fresh["search_form"]
            assert live == fresh, (live, fresh)

            # The search form that came with the refresh works.
            page.fill("#run-search input[name=q]", "Close the ticket")
            page.press("#run-search input[name=q]", "Enter")
            page.wait_for_selector("#strip.searched")
            settle(page)
            assert page.locator("#step-list [data-n]").count() == 1
        assert watch.errors == [] and watch.unexpected_requests() == []
    finally:
        if worker is not None:
            worker.stop()
