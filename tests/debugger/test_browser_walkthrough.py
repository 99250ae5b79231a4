"""An operator and a viewer use the debugger in headless Chromium."""

from __future__ import annotations

import re

import pytest

from agentrun.models import Event, Run
from tests.base import make_people
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_an_operator_walks_from_login_to_a_step_its_snapshots_its_diff_and_the_audit(
    live_server, browser
):
    people = make_people()
    olga = people["operator"]
    run = runs.walkthrough_run(olga)
    assert run.status == "succeeded" and run.steps.count() == 8
    retry = runs.walkthrough_run(
        olga, evidence="signed delivery note", goal="Refund order 1042, second try"
    )
    runs.failing_run(olga)
    waiting = runs.waiting_run(olga)
    queued = runs.queued_run(olga)

    with page_for(browser, live_server.url) as (page, watch):
        page.goto("/")
        assert "/login/" in page.url
        shot(page, "01-login")
        login(page, "olga")

        # The run list: every run, its status and agent; filters narrow it.
        assert page.locator("#run-rows tr").count() == 5
        shot(page, "02-run-list")
        page.fill("input[name=q]", str(run.pk)[:8])
        page.click(".filters button[type=submit]")
        assert page.locator("#run-rows tr").count() == 1
        page.click(f"#run-rows a[href='/runs/{run.pk}/']")

        # The run: header, phase strip, step list; the default step is the last one.
        page.wait_for_selector("#strip .cell")
        assert page.locator("#strip .cell").count() == 8
        assert page.locator("#step-body").get_attribute("data-step") == "8"
        assert "Refunded 42.50" in page.inner_text(".runhead")
        settle(page)
        shot(page, "03-run-detail")

        # Select step 6 in the strip: its body loads in place and the URL says so.
        page.click("#strip .cell[data-n='6']")
        page.wait_for_selector("#step-body[data-step='6']")
        assert page.url.endswith(f"/runs/{run.pk}/steps/6/")
        body = page.locator("#step-body")
        assert "Re-read the order with the new evidence" in body.inner_text()
        assert body.locator(".call").count() == 2
        assert body.locator(".call .kind-read").count() == 2
        assert f"{run.pk}:6:0:echo:" in body.inner_text()  # idempotency key shown
        page.wait_for_selector("#snap-pane .diffhead")  # the diff loads on demand
        assert page.locator("#snap-pane .chg-appended").count() >= 2
        assert page.locator("#strip .cell.sel").get_attribute("data-n") == "6"
        settle(page)
        shot(page, "04-step-6")

        # Keyboard time travel: → and j go forward, ← and k go back.
        page.keyboard.press("ArrowRight")
        page.wait_for_selector("#step-body[data-step='7']")
        assert page.url.endswith("/steps/7/")
        page.keyboard.press("k")
        page.wait_for_selector("#step-body[data-step='6']")
        assert page.url.endswith("/steps/6/")

        # Pre and post snapshots in the pane, then on their own pages.
        page.click("#snap-pane .tab:has-text('Pre state')")
        page.wait_for_selector("#snap-pane .tree-wrap .jt")
        assert "tool_calls" in page.inner_text("#snap-pane .tree-wrap")
        page.click("#snap-pane .tab:has-text('Post state')")
        page.wait_for_selector("#snap-pane .tab.on:has-text('Post state')")
        page.goto(f"/runs/{run.pk}/steps/6/pre/")
        assert page.locator(".tree-wrap .jt-key").count() > 10
        replay = page.get_by_role("link", name="Replay from before step 6")
        assert replay.get_attribute("href") == f"/runs/{run.pk}/steps/6/pre/fork/"
        shot(page, "05-snapshot-pre")
        page.goto(f"/runs/{run.pk}/steps/6/post/?path=history")
        assert page.locator(".pathcrumbs").inner_text().startswith("$")
        shot(page, "06-snapshot-post-history")

        # The diff of step 6 on its own page: summary, appended items, inline text diff.
        page.goto(f"/runs/{run.pk}/steps/6/diff/")
        summary = page.inner_text(".diffhead .summary")
        assert re.match(r"^\d+ added, \d+ changed", summary), summary
        assert page.locator(".chg-appended").count() >= 2
        shot(page, "07-diff-step-6")
        # ... and against the same step of another run, by URL (a deep link for a ticket).
        page.goto(f"/diff/?a={run.pk}:1:post&b={retry.pk}:1:post")
        assert page.locator(".textdiff ins").count() >= 1  # "photo" became "signed delivery note"
        shot(page, "08-compare")

        # Operator actions: approve the waiting run, cancel the queued one.
        page.goto(f"/runs/{waiting.pk}/")
        assert "Waiting for approval" in page.inner_text(".runhead")
        shot(page, "09-waiting-run")
        page.fill(".callout.wait input[name=comment]", "invoice checked")
        page.click("button[data-action=approve]")
        page.wait_for_selector(".flash-success")
        page.goto(f"/runs/{queued.pk}/")
        page.fill("input[name=reason]", "duplicate job")
        page.click("button[data-action=cancel]")
        page.wait_for_selector(".flash-success")
        assert Run.objects.get(pk=queued.pk).status == "cancelled"

        # The audit: who did what, and every write/hybrid call with its key.
        page.goto("/audit/")
        actions = page.inner_text("#audit-actions")
        assert "approved" in actions and "invoice checked" in actions
        assert "run_cancelled" in actions and "duplicate job" in actions
        calls = page.inner_text("#audit-calls")
        assert "ledger_write" in calls and "reserve" in calls and "notify" in calls
        assert "compensated" in calls  # the failed run's reservation was released
        shot(page, "10-audit")

    assert watch.dialogs == []
    assert watch.unexpected_requests() == []
    assert watch.errors == []


def test_a_viewer_sees_no_mutating_buttons_and_is_refused_when_posting_anyway(live_server, browser):
    people = make_people()
    waiting = runs.waiting_run(people["operator"])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{waiting.pk}/")
        assert "Waiting for approval" in page.inner_text(".runhead")
        assert "An operator must decide" in page.inner_text(".runhead")
        assert page.locator("button[data-action]").count() == 0
        assert page.locator("form[action$='/cancel/'], form[action$='/approval/']").count() == 0
        page.click("#strip .cell[data-n='1']")
        page.wait_for_selector("#step-body[data-step='1'] #snap-pane .diffhead")
        assert page.locator("[data-action=replay]").count() == 0
        shot(page, "11-viewer-run")

        token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
        for action, data in (("approval", {"decision": "approve"}), ("cancel", {"reason": "x"})):
            response = page.request.post(
                f"/runs/{waiting.pk}/{action}/", form=data, headers={"X-CSRFToken": token}
            )
            assert response.status == 403, action

    waiting.refresh_from_db()
    assert waiting.status == "waiting"
    assert not Event.objects.filter(user=people["viewer"]).exists()
    assert watch.dialogs == []


def test_the_run_page_follows_a_run_live_and_stops_polling_when_it_finishes(live_server, browser):
    from agentrun import engine
    from tests.base import calls, final, make_run, script

    people = make_people()
    run = make_run(
        script(
            calls({"tool": "echo", "args": {"n": 1}}, thought="first"),
            calls({"tool": "echo", "args": {"n": 2}}, thought="second"),
            final("all done"),
            goal="Watch me run",
        ),
        user=people["operator"],
    )

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{run.pk}/")
        assert "No steps yet" in page.inner_text("#run-live")
        assert page.locator(".live-dot").count() == 1

        engine.execute_step(run.pk, 1)
        page.wait_for_selector("#strip .cell[data-n='1']", timeout=8000)
        assert "first" in page.inner_text("#step-list")

        engine.execute_step(run.pk, 2)
        engine.execute_step(run.pk, 3)
        page.wait_for_selector(".runhead .badge.st-succeeded", timeout=8000)
        assert page.locator("#strip .cell").count() == 3
        assert page.locator(".live-dot").count() == 0
        shot(page, "12-live-run-finished")

        polls = sum("/live/" in url for url in watch.requests)
        page.wait_for_timeout(4500)
        assert sum("/live/" in url for url in watch.requests) == polls  # finished: no more polling

    assert watch.dialogs == [] and watch.unexpected_requests() == [] and watch.errors == []
