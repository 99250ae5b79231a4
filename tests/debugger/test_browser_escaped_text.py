"""Text a tool sent that the database can't hold is shown escaped and marked, so an operator
sees what was sent."""

from __future__ import annotations

import pytest

from agentrun.tools import ToolContext, tool
from tests.base import calls, drive, final, make_people, make_run, script
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@tool(kind="read", cache=False)
def raw_bytes_reader(ctx: ToolContext) -> dict:
    return {"text": "header\x00body", "broken": "half \udc80 pair"}


def test_escaped_text_is_marked_on_the_snapshot_page(live_server):
    people = make_people()
    run = drive(
        make_run(
            script(calls({"tool": "raw_bytes_reader", "args": {}}), final("read it")),
            user=people["operator"],
        )
    )
    assert run.status == "succeeded"
    with chromium() as browser, page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{run.pk}/steps/1/post/")
        settle(page)
        marks = page.locator("mark.esc")
        assert marks.count() >= 2
        titles = {marks.nth(i).get_attribute("title") for i in range(marks.count())}
        assert any("U+0000 (a NUL)" in t for t in titles), titles
        assert any("U+DC80 (a lone surrogate)" in t for t in titles), titles
        # The operator opens the tool call's record in the state tree.
        page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
        assert page.locator("mark.esc:visible").count() >= 2
        assert "header\\u0000body" in page.inner_text("body")
        shot(page, "snapshot-escaped-text")
        assert not watch.errors
