"""A LangGraph thread in Chromium: its timeline, the tool step's diff, a watch on the
`messages` channel."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from agentrun.integrations.langgraph import run_id_for  # noqa: E402
from tests.debugger.browser import chromium, login, page_for, settle, shot  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_a_langgraph_thread_reads_in_the_debugger(ran, people, live_server, browser):
    run_id = run_id_for("order-42")
    with page_for(browser, live_server.url) as (page, seen):
        login(page, people["viewer"].username)
        page.goto(f"/runs/{run_id}/steps/4/")
        settle(page)
        assert page.locator("#strip .cell").count() == 5  # one step per super-step
        assert page.inner_text("#step-body .thought") == "LangGraph loop step 2: tools ran"
        pane = page.locator("#snap-pane")
        pane.get_by_text("order 42: shipped on May 2").first.wait_for()
        assert "tool" in pane.inner_text()
        shot(page, "langgraph-tool-step")

        page.goto(f"/runs/{run_id}/watch/?path=messages")
        settle(page)
        steps = [e.inner_text() for e in page.locator(".watch-entry .watch-step").all()]
        assert steps == ["Step 2", "Step 3", "Step 4", "Step 5"], steps
        shot(page, "langgraph-watch-messages")
        assert seen.unexpected_requests() == []
        assert seen.errors == []
