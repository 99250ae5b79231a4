"""An operator replays a run from a snapshot with an edited state, then compares the fork."""

from __future__ import annotations

import json

import pytest

from agentrun.lifecycle import services
from agentrun.models import Event, Run
from tests.base import drive, make_people
from tests.debugger import runs
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

GOAL = '"goal": "Refund order 1042 and hold replacement stock"'
NEW_GOAL = '"goal": "Refund order 1042; hold no stock"'


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_forks_from_a_pre_snapshot_with_an_edited_goal_and_compares(
    live_server, browser
):
    people = make_people()
    run = runs.walkthrough_run(people["operator"])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{run.pk}/")
        page.click("#strip .cell[data-n='4']")
        page.wait_for_selector("#step-body[data-step='4'] #snap-pane .diffhead")
        page.click("#snap-pane .tab:has-text('Pre state')")
        page.wait_for_selector("#snap-pane .tab.on:has-text('Pre state')")
        page.click("#snap-pane [data-action=replay]")
        page.wait_for_url(f"**/runs/{run.pk}/steps/4/pre/fork/")

        # The form: sandbox by default, the snapshot's state as pretty JSON behind the tree.
        assert page.is_checked("input[name=mode][value=sandbox]")
        page.wait_for_selector("#fork-tree li[data-path='$']")
        page.click("[data-editor-view=raw]")
        text = page.input_value("#fork-state")
        assert json.loads(text)["memory"]["goal"] == "Refund order 1042 and hold replacement stock"
        assert not page.is_visible(".live-effects")
        shot(page, "40-fork-form")

        # Live mode lists the side effects it would repeat and asks for a confirmation.
        page.check("input[name=mode][value=live]")
        assert page.is_visible(".live-effects")
        effects = page.inner_text(".live-effects")
        assert "ledger_write" not in effects and "notify" in effects  # only after step 4
        shot(page, "41-fork-live", full_page=False)
        page.check("input[name=mode][value=sandbox]")

        # The editor: Tab indents; broken JSON is flagged when leaving it, and by the server.
        page.click("#fork-state")
        page.keyboard.press("Control+End")
        page.keyboard.press("Tab")
        assert page.input_value("#fork-state") == text + "  "
        page.fill("#fork-state", text.replace(GOAL, NEW_GOAL + ","))
        page.focus("input[name=reason]")
        status = page.inner_text("#fork-state-status")
        assert status.startswith("Invalid JSON at line"), status
        page.click("[data-action=fork]")
        page.wait_for_selector(".field-error")
        assert "Invalid JSON at line" in page.inner_text(".field-error")
        assert Run.objects.filter(parent=run).count() == 0
        shot(page, "42-fork-invalid-json", full_page=False)

        # A valid edit: preview the changes, then start the replay.
        page.fill("#fork-state", text.replace(GOAL, NEW_GOAL))
        page.fill("input[name=reason]", "what if we hold no stock")
        page.click("[data-action=preview]")
        page.wait_for_selector("#fork-changes")
        assert "memory.goal" in page.inner_text("#fork-changes")
        assert page.input_value("input[name=reason]") == "what if we hold no stock"
        shot(page, "43-fork-preview")
        page.click("[data-action=fork]")

        page.wait_for_selector(".callout.forkinfo")
        fork = Run.objects.get(parent=run)
        assert page.url.endswith(f"/runs/{fork.pk}/")
        banner = page.inner_text(".callout.forkinfo")
        assert f"Fork of {str(run.pk)[:8]} from step 4 (pre), sandbox mode" in banner
        assert "state edited" in banner
        assert Event.objects.get(run=fork, kind="run_forked").reason == "what if we hold no stock"
        shot(page, "44-fork-queued", full_page=False)

        # No worker here: run the fork from the test, then look again.
        assert drive(fork).status == "succeeded"
        page.reload()
        page.wait_for_selector(".runhead .badge.st-succeeded")
        assert page.locator("#strip .cell").count() == 5  # steps 4 to 8
        settle(page)
        shot(page, "45-fork-finished")

        # Compare: the parent's steps 1-3 are shared history, step 4 is where they part.
        page.click("[data-action=compare]")
        page.wait_for_selector(".crow.first-div")
        assert page.locator(".crow.first-div").get_attribute("data-n") == "4"
        assert page.locator(".crow.shared").count() == 3
        assert "memory.goal" in page.inner_text("#compare-diff")
        shot(page, "46-compare")
        page.click(".crow[data-n='8']")
        page.wait_for_selector("#compare-diff[data-step='8']")
        assert page.url.endswith(f"/runs/{fork.pk}/compare/?step=8")
        # The row is marked once htmx has settled the swap.
        page.wait_for_selector(".crow.sel[data-n='8']")
        assert_inert(page)
        shot(page, "47-compare-step-8")

        # An untouched state is not sent back: the script says "unchanged" instead.
        page.goto(f"/runs/{run.pk}/steps/2/post/fork/")
        page.check("input[name=mode][value=recorded]")
        with page.expect_request(lambda r: r.method == "POST") as sent:
            page.click("[data-action=fork]")
        body = sent.value.post_data.split("&")
        assert "state_unchanged=1" in body and not any(f.startswith("state=") for f in body)
        page.wait_for_selector(".callout.forkinfo")
        recorded = Run.objects.filter(parent=run).exclude(pk=fork.pk).get()
        assert recorded.mode == "recorded" and recorded.first_step == 3
        assert Event.objects.get(run=recorded, kind="run_forked").payload["edited"] is False
        assert "recorded mode" in page.inner_text(".callout.forkinfo")
        assert "replayed identically so far" in page.inner_text(".callout.forkinfo")

        # The parent lists its forks, and theirs.
        olga = people["operator"]
        grandchild = services.fork_run(fork, step=6, at="post", mode="recorded", user=olga)
        live = services.fork_run(run, step=2, mode="live", confirm_live=True, user=olga)
        page.goto(f"/runs/{run.pk}/")
        tree = page.locator(".forktree")
        assert tree.locator(":scope > li").count() == 3
        nested = tree.locator(":scope > li").first.locator("ul li")
        assert str(grandchild.pk)[:8] in nested.inner_text()
        assert str(live.pk)[:8] in tree.inner_text()
        shot(page, "48-parent-with-forks", full_page=False)
        page.goto(f"/runs/{grandchild.pk}/")
        lineage = page.inner_text(".lineage")
        assert lineage.index(str(run.pk)[:8]) < lineage.index(str(fork.pk)[:8])
        shot(page, "49-grandchild-lineage", full_page=False)

    assert watch.dialogs == []
    assert watch.unexpected_requests() == []
    # The one expected error: the form sent back with the invalid JSON is a 400.
    assert watch.errors == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]


def test_a_viewer_sees_no_replay_button_and_is_refused_the_form(live_server, browser):
    people = make_people()
    run = runs.walkthrough_run(people["operator"])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{run.pk}/steps/4/pre/")
        assert page.locator("[data-action=replay]").count() == 0
        response = page.goto(f"/runs/{run.pk}/steps/4/pre/fork/")
        assert response.status == 403

    assert Run.objects.filter(parent=run).count() == 0
