"""The demo's incident in a browser: when did the agent's copy of the cart change?

On the stale-cart shop run, the history of memory.notes.cart shows one change, at step 2
(the cart read), and none after it although the user removed the stove after step 2; the
recommendation step is a click away. After a fork with the cart corrected, the compare page
shows the watched path in the fork and its parent side by side.
"""

from __future__ import annotations

import json

import pytest

from agentrun.lifecycle import services
from agentrun.store import snapshots
from tests.base import INCIDENT, drive, make_people
from tests.debugger.browser import assert_inert, chromium, login, page_for, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_watching_the_cart_note_finds_the_stale_cart_and_the_fork_corrects_it(live_server, browser):
    people = make_people()
    incident = drive(services.start_run("shop", INCIDENT), through_backoff=True)
    assert incident.status == "succeeded", incident.error

    with page_for(browser, live_server.url) as (page, seen):
        login(page, "victor")
        # The state the recommendation was decided from: the notes, and the cart in them.
        page.goto(f"/runs/{incident.pk}/steps/3/pre/?path=memory.notes")
        cart = page.locator(".jt-leaf", has=page.locator(".jt-key", has_text="cart")).first
        cart.hover()
        cart.locator(".jt-watch").click()
        page.wait_for_url("**/watch/?path=memory.notes.cart&step=3")

        assert page.inner_text("h1") == "History of memory.notes.cart"
        summary = page.inner_text(".watch-summary")
        assert "Changed once" in summary and "added at step 2, and never again" in summary
        entries = page.locator(".watch-entry")
        assert entries.count() == 1
        entry = entries.first
        assert entry.locator(".watch-step").inner_text() == "Step 2"
        assert "added" in entry.inner_text() and "Reading ben's cart." in entry.inner_text()
        assert "STOVE-1" in entry.locator(".watch-vals").inner_text()
        around = page.inner_text(".watch-around")
        assert "previous change: step 2" in around and "step 3 did not change it" in around
        assert "no change after step 3" in around
        shot(page, "70-watch-cart-note")

        # One click to the recommendation step: it recommended for the stove, from memory.
        page.click(".watch-around .watch-back")
        page.wait_for_url(f"**/runs/{incident.pk}/steps/3/")
        page.wait_for_selector("#step-body[data-step='3']")
        body = page.inner_text("#step-body")
        assert "Looking for an accessory to go with the cart" in body and "STOVE-1" in body
        shot(page, "71-watch-recommendation-step", full_page=False)

        # From the step, the watch form leads back to the value's previous and next change.
        page.locator(".watch-from-step").scroll_into_view_if_needed()
        shot(page, "72-watch-form-on-the-step", full_page=False)
        page.fill(".watch-from-step input[name=path]", "/memory/notes/cart")
        page.click(".watch-from-step button")
        page.wait_for_url("**/watch/?path=*")
        assert "previous change: step 2" in page.inner_text(".watch-around")

        # A bad path is a form error, not a crash.
        page.fill("#watch-path", "memory..notes")
        page.click(".watch-form button")
        page.wait_for_selector("#watch-error")
        assert "expected a key" in page.inner_text("#watch-error")
        shot(page, "72-watch-bad-path-error", full_page=False)

        # The fix: a fork from the pre snapshot of step 3 with the cart corrected.
        state = snapshots.load(incident.pk, 3, "pre")
        cart_now = [
            x for x in json.loads(state["memory"]["notes"]["cart"]) if x["sku"] != "STOVE-1"
        ]
        state["memory"]["notes"]["cart"] = json.dumps(cart_now)
        fork = services.fork_run(
            incident, step=3, at="pre", state=state, reason="stale cart", user=people["operator"]
        )
        fork = drive(fork, through_backoff=True)
        assert fork.status == "succeeded", fork.error

        page.goto(f"/runs/{fork.pk}/compare/?path=memory.notes.cart")
        table = page.locator("table.watch-side")
        rows = table.locator("tbody tr")
        assert rows.count() == 3  # step 2 (the parent's read), step 3 pre (the fix), now
        step2 = rows.nth(0).locator("td")
        assert "STOVE-1" in step2.nth(1).inner_text()
        assert step2.nth(2).inner_text() == "— the same (inherited)"
        step3 = rows.nth(1).locator("td")
        assert step3.nth(1).inner_text() == "—"
        assert "TENT-2P" in step3.nth(2).inner_text() and "STOVE-1" not in step3.nth(2).inner_text()
        now = rows.nth(2).locator("td")
        assert "differs" in now.nth(0).inner_text()
        assert "STOVE-1" in now.nth(1).inner_text() and "STOVE-1" not in now.nth(2).inner_text()
        table.scroll_into_view_if_needed()
        shot(page, "73-compare-watched-cart")

        # The fork's own history: the parent's read (inherited), then the fix.
        page.click(f"table.watch-side th a[href^='/runs/{fork.pk}/watch/']")
        page.wait_for_url(f"**/runs/{fork.pk}/watch/**")
        assert page.locator(".watch-entry").count() == 2
        assert "inherited from" in page.locator(".watch-entry").first.inner_text()
        shot(page, "74-watch-fork")

        assert_inert(page)
        assert seen.unexpected_requests() == []
        # The one failed load the browser reports is the bad path's 400, meant.
        assert seen.errors == [
            "Failed to load resource: the server responded with a status of 400 (Bad Request)"
        ]
        assert seen.dialogs == []
