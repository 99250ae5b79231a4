"""LLM and tool output is untrusted: on every page it must stay text, never markup or requests."""

from __future__ import annotations

import pytest

from agentrun.models import Run
from tests.base import drive, make_people
from tests.debugger import runs
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_hostile_run_output_renders_as_text_on_every_page(live_server, browser):
    people = make_people()
    run = runs.hostile_run(people["operator"])
    assert run.status == "failed" and run.steps.count() == 4
    runs.hostile_actions(people["operator"])
    x = runs.XSS

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        visited = []

        def visit(url: str) -> None:
            page.goto(url)
            settle(page)
            assert_inert(page)
            visited.append(url)

        visit("/")
        assert x["script"] in page.inner_text("#run-rows")
        visit(f"/?q={x['script']}")
        visit(f"/runs/{run.pk}/")
        assert x["script"] in page.title()  # the goal is in the title, as text
        for n in range(1, 5):
            page.click(f"#strip .cell[data-n='{n}']")
            page.wait_for_selector(f"#step-body[data-step='{n}'] #snap-pane .tabs")
            settle(page)
            assert_inert(page)
            for tab in ("Pre state", "Post state"):
                page.click(f"#snap-pane .tab:has-text('{tab}')")
                page.wait_for_selector(f"#snap-pane .tab.on:has-text('{tab}')")
                settle(page)
                assert_inert(page)
        text = page.inner_text("#step-body")
        assert x["img"] in text and x["close_script"] in text  # the failure, verbatim
        shot(page, "20-hostile-step-4")
        page.click("#strip .cell[data-n='1']")
        page.wait_for_selector("#step-body[data-step='1'] #snap-pane .diffhead")
        body = page.inner_text("#step-body")
        for payload in (x["img"], x["js_link"]):
            assert payload in body
        page.click("#step-body .call details summary")
        shot(page, "21-hostile-step-1")
        for n in range(1, 5):
            visit(f"/runs/{run.pk}/steps/{n}/")
            visit(f"/runs/{run.pk}/steps/{n}/pre/")
            visit(f"/runs/{run.pk}/steps/{n}/post/")
            visit(f"/runs/{run.pk}/steps/{n}/diff/")
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        assert_inert(page)
        shot(page, "22-hostile-diff")
        visit(f"/diff/?a={run.pk}:1:pre&b={run.pk}:4:post")
        # Replay from here: the hostile state in the editor, then the fork and the comparison.
        visit(f"/runs/{run.pk}/steps/2/pre/fork/")
        assert x["script"] in page.input_value("#fork-state")  # as text, in the editor
        page.fill("input[name=reason]", x["img"] + x["hx_on"])
        page.click("[data-action=fork]")
        page.wait_for_selector(".callout.forkinfo")
        settle(page)
        assert_inert(page)
        assert x["img"] + x["hx_on"] in page.inner_text(".callout.forkinfo")
        fork = Run.objects.get(parent=run)
        drive(fork)
        visit(f"/runs/{fork.pk}/")
        visit(f"/runs/{fork.pk}/compare/?step=4")
        assert x["img"] in page.inner_text("#compare-rows")
        shot(page, "24-hostile-compare")
        visit("/audit/")
        assert x["img"] + x["hx_on"] in page.inner_text("#audit-actions")
        shot(page, "23-hostile-audit")
        page.wait_for_timeout(1500)  # give anything that slipped through time to fire

    assert watch.dialogs == []
    assert watch.unexpected_requests() == []
    assert not [url for url in watch.requests if "/api/" in url]
    assert watch.errors == []
