"""The incident walk on the demo data, counted in clicks: from typing "stale" in the run
list's search to the compare page of a fork with the cart corrected, in at most 8."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from agentrun.management.commands.demo import STORIES
from agentrun.models import Run
from agentrun.store import snapshots
from tests.base import drive
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MAX_CLICKS = 8


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_the_stale_cart_incident_takes_at_most_8_clicks_to_a_compared_fix(live_server, browser):
    call_command("demo", "--no-logins", stdout=StringIO())
    incident = next(s for s in STORIES if s.label == "incident").find()
    clicks: list[str] = []

    with page_for(browser, live_server.url) as (page, watch):

        def click(selector: str) -> None:
            clicks.append(selector)
            page.click(selector)

        login(page, "operator", "demo")
        # Find the run: the search matches the label problem=stale-cart.
        page.goto("/")
        page.fill(".filters input[name=q]", "stale")
        click(".filters button[type=submit]")
        page.wait_for_url("**/?q=stale**")
        rows = page.locator("#run-rows tr")
        assert rows.count() == 2  # the incident and the demo's fix (a fork keeps the labels)
        click("#run-rows tr:not(:has(.badge.fork)) td.run-id a")
        page.wait_for_url(f"**/runs/{incident.pk}/**")

        # Find the step: step 3 recommended for a cart it read at step 2.
        click("#strip .cell[data-n='3']")
        page.wait_for_selector("#step-body[data-step='3'] #snap-pane .diffhead")
        assert "memory.notes.recommendation" in page.inner_text("#snap-pane")

        # Fork from before it, the cart corrected: the editor opens at what step 2 changed.
        replay = page.locator("#snap-pane [data-action=replay]")
        assert replay.inner_text() == "Replay from before step 3"
        click("#snap-pane [data-action=replay]")
        page.wait_for_url(f"**/runs/{incident.pk}/steps/3/pre/fork/")
        stove = "#fork-tree li[data-path='memory.notes.cart[0]']"
        page.wait_for_selector(stove)
        assert "STOVE-1" in page.inner_text(stove)
        click(f"{stove} > .te-row .te-remove")
        page.wait_for_selector("#fork-changes, #fork-check[data-valid=true]")
        page.fill("input[name=reason]", "the cart changed after step 2")
        shot(page, "walk-fork-form", full_page=False)
        click("[data-action=fork]")
        page.wait_for_selector(".callout.forkinfo")
        fork = Run.objects.filter(parent=incident).order_by("-created_at").first()
        assert page.url.endswith(f"/runs/{fork.pk}/")
        cart = json.loads(snapshots.load(fork.pk, 3, "pre")["memory"]["notes"]["cart"])
        assert [line["sku"] for line in cart] == ["TENT-2P"]  # the stove is out

        # The fork runs (here, in the test) while its page is open, then: compare.
        assert drive(fork).status == "succeeded"
        page.wait_for_selector(".runhead .badge.st-succeeded", timeout=10_000)
        click("[data-action=compare]")
        page.wait_for_selector(".crow.first-div")
        settle(page)
        said = page.inner_text(".callout.diverged")
        assert "First divergence at step 3" in said
        assert "the fork started from an edited state" in said
        shot(page, "walk-compare", full_page=False)

    assert len(clicks) <= MAX_CLICKS, clicks
    print(f"incident walk: {len(clicks)} clicks: {clicks}")
    assert watch.errors == [] and watch.dialogs == []
