"""An operator fixes the demo's stale-cart incident with the fork page's tree editor.

The cart the agent remembers is JSON inside a JSON string (memory.notes.cart); the
operator removes STOVE-1 from it in the tree, sees the live check and the diff the
fork starts from, forks, and the fork starts from the corrected string.
"""

from __future__ import annotations

import json

import pytest

from agentrun.lifecycle.services import start_run
from agentrun.management.commands.demo import FIX_OF, FIX_STEP, STORIES, advance, corrected_state
from agentrun.models import Event, Run
from agentrun.store import snapshots
from tests.base import make_people
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CART = "memory.notes.cart"


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def demo_incident(operator) -> Run:
    """The demo's incident story, played as `manage.py demo` plays it."""
    [story] = [s for s in STORIES if s.label == FIX_OF]
    run = advance(start_run(story.agent, story.input, user=operator), operator)
    assert run.status == story.expect, run.error
    return run


def node(page, path: str):
    return page.locator(f"#fork-tree li[data-path='{path}']")


def expand(page, path: str) -> None:
    node(page, path).locator(":scope > .te-row [data-te=toggle]").click()
    node(page, path).locator(":scope > .te-children").wait_for()


def checked(page, text: str) -> str:
    """The live check's panel once it says `text`."""
    page.wait_for_function(
        "t => (document.getElementById('fork-check') || {}).innerText?.includes(t)", arg=text
    )
    settle(page)
    return page.inner_text("#fork-check")


def test_an_operator_removes_an_item_from_json_text_in_the_tree_and_forks(live_server, browser):
    people = make_people()
    incident = demo_incident(people["operator"])
    before = snapshots.load(incident.pk, FIX_STEP, "pre")
    stale = before["memory"]["notes"]["cart"]
    assert isinstance(stale, str) and "STOVE-1" in stale  # JSON text in a JSON string
    wanted = corrected_state(incident, FIX_STEP)["memory"]["notes"]["cart"]

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{incident.pk}/steps/{FIX_STEP}/")
        page.click("#snap-pane .tab:has-text('Pre state')")
        page.wait_for_selector("#snap-pane .tab.on:has-text('Pre state')")
        page.click("#snap-pane [data-action=replay]")
        page.wait_for_url(f"**/runs/{incident.pk}/steps/{FIX_STEP}/pre/fork/")

        # The tree is the editor; the raw JSON is one click away.
        page.wait_for_selector("#fork-tree:not([hidden]) li[data-path='$']")
        assert not page.is_visible("#fork-state")
        assert page.get_attribute("[data-editor-view=tree]", "aria-pressed") == "true"
        # It opens at what changed last before the snapshot: step 2 read the cart.
        for path in ("memory", "memory.notes", CART):
            assert node(page, path).get_attribute("aria-expanded") == "true", path
        assert node(page, "history").get_attribute("aria-expanded") == "false"
        cart = node(page, CART)
        assert "JSON text" in cart.locator(":scope > .te-row").inner_text()
        first = node(page, f"{CART}[0]")
        expand(page, f"{CART}[0]")
        assert '"STOVE-1"' in node(page, f"{CART}[0].sku").inner_text()
        shot(page, "50-fork-editor-tree")

        # Remove the STOVE-1 line inside the string: the string is rewritten, in its style.
        first.locator(":scope > .te-row [data-te=remove]").click()
        assert '"TENT-2P"' in node(page, f"{CART}[0]").inner_text()
        text = json.loads(page.input_value("#fork-state"))
        assert text["memory"]["notes"]["cart"] == wanted
        rest = {k: v for k, v in text["memory"]["notes"].items() if k != "cart"}
        assert rest == {k: v for k, v in before["memory"]["notes"].items() if k != "cart"}

        # The live check: valid, and the diff the fork starts from.
        report = checked(page, "Valid")
        assert "1 changed" in report and CART in report
        assert "STOVE-1" in page.inner_text("#fork-check .textdiff del")
        shot(page, "51-fork-editor-preview")

        # A bad edit in the tree is flagged by the server's check, beside the editor.
        phase = node(page, "phase")
        phase.locator(":scope > .te-row [data-te=edit]").click()
        page.fill("#fork-tree .te-editform .te-input", "sleeping")
        shot(page, "52-fork-editor-editing", full_page=False)
        page.keyboard.press("Enter")
        report = checked(page, "A fork would refuse this state")
        assert "unknown phase 'sleeping'" in report
        # The tree marks the entry once htmx settles the check's swap (a few ms after it).
        page.wait_for_selector("#fork-tree li[data-path='phase'].te-flagged")
        assert page.locator("#fork-tree .te-flagged").count() == 1
        shot(page, "52-fork-editor-schema-error", full_page=False)
        node(page, "phase").locator(":scope > .te-row [data-te=edit]").click()
        page.fill("#fork-tree .te-editform .te-input", before["phase"])
        page.keyboard.press("Enter")
        checked(page, "Valid")
        assert page.locator("#fork-tree .te-flagged").count() == 0

        # An error deep in the tree opens the tree down to it.
        expand(page, "history")
        role = "history[1].role"
        node(page, "history").locator(":scope > .te-row [data-te=toggle]").click()
        page.click("[data-editor-view=raw]")
        raw = page.input_value("#fork-state")
        state = json.loads(raw)
        role_was = state["history"][1]["role"]
        state["history"][1]["role"] = "bot"
        page.fill("#fork-state", json.dumps(state, indent=2, ensure_ascii=False))
        page.click("[data-editor-view=tree]")
        checked(page, "A fork would refuse this state")
        page.wait_for_selector(f"#fork-tree li.te-flagged[data-path='{role}']")
        assert "history[1].role must be one of" in page.inner_text("#fork-check")
        shot(page, "54-fork-editor-error-in-tree", full_page=False)
        node(page, role).locator(":scope > .te-row [data-te=edit]").click()
        page.fill("#fork-tree .te-editform .te-input", role_was)
        page.keyboard.press("Enter")
        checked(page, "Valid")

        # Add a key, then take it out again: only the cart is left changed.
        node(page, "memory.notes").locator(":scope > .te-row [data-te=add]").click()
        page.fill("#fork-tree .te-addform .te-keyinput", "search")
        page.fill("#fork-tree .te-addform .te-input", "x")
        page.keyboard.press("Enter")
        assert 'There is a key "search" already' in page.inner_text("#fork-tree .te-problem")
        page.fill("#fork-tree .te-addform .te-keyinput", "checked by")
        page.fill("#fork-tree .te-addform .te-input", "olga")
        shot(page, "53-fork-editor-add-key", full_page=False)
        page.click("#fork-tree .te-addform [data-te-save]")
        added = node(page, 'memory.notes["checked by"]')
        assert '"olga"' in added.inner_text()
        assert "1 added" in checked(page, "1 added")
        added.locator(":scope > .te-row [data-te=remove]").click()
        assert added.count() == 0
        page.wait_for_function(
            "() => document.querySelector('#fork-check .diffhead .summary')?.innerText"
            " === '1 changed in memory.notes'"
        )

        # Raw JSON shows the same state, and edits there come back to the tree.
        page.click("[data-editor-view=raw]")
        assert page.is_visible("#fork-state") and not page.is_visible("#fork-tree")
        raw = page.input_value("#fork-state")
        assert json.loads(raw)["memory"]["notes"]["cart"] == wanted
        page.fill("#fork-state", raw.replace('"phase": "', '"phase": "', 1))
        page.click("[data-editor-view=tree]")
        assert page.is_visible("#fork-tree")
        assert node(page, f"{CART}[0]").count() == 1  # still expanded where it was

        # Text that is no JSON stays in the raw editor, and the check says where it breaks.
        page.click("[data-editor-view=raw]")
        good = page.input_value("#fork-state")
        page.fill("#fork-state", good.replace('"phase":', '"phase"', 1))
        page.click("[data-editor-view=tree]")
        assert page.is_visible("#fork-state") and not page.is_visible("#fork-tree")
        page.wait_for_selector("#fork-state-status:has-text('fix it in the raw editor first')")
        assert "Invalid JSON at line 3" in checked(page, "Invalid JSON at line")
        page.fill("#fork-state", good)
        page.click("[data-editor-view=tree]")
        assert page.is_visible("#fork-tree")
        checked(page, "Valid")

        # A phone's width: the editor above the check, nothing cut off.
        page.set_viewport_size({"width": 390, "height": 844})
        page.locator("#fork-editor").scroll_into_view_if_needed()
        shot(page, "55-fork-editor-phone", full_page=False)
        box = page.locator("#fork-tree").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
        page.set_viewport_size({"width": 1440, "height": 900})

        page.fill("input[name=reason]", "cart change never reached the agent's context")
        page.click("[data-action=fork]")
        page.wait_for_selector(".callout.forkinfo")
        assert_inert(page)

    fork = Run.objects.get(parent=incident)
    state = snapshots.load(fork.pk, FIX_STEP, "pre")
    assert state["memory"]["notes"]["cart"] == wanted
    assert Event.objects.get(run=fork, kind="run_forked").payload["edited"] is True
    assert watch.dialogs == []
    assert watch.unexpected_requests() == []
    assert watch.errors == []
