"""An llm step's request in Chromium: from the step, one click to what it sent the model,
its new messages marked; the page looks right at desktop and phone widths."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from tests.agentrun.llm_load import API_KEY
from tests.base import drive, make_people
from tests.debugger.browser import chromium, login, page_for, shot
from tests.fake_openai import FakeOpenAI, completion, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_one_click_from_a_step_to_the_request_it_sent(live_server, settings, monkeypatch):
    make_people()
    with FakeOpenAI() as fake, chromium() as browser:
        settings.AGENTRUN_LLM_BASE_URL = fake.base_url
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        for turn in range(3):
            fake.push(completion(tool_calls=[tool_call("echo", {"text": f"page {turn}"},
                                                       id=f"call_{turn}")]))  # fmt: skip
        fake.push(completion("read three pages"))
        run = drive(services.start_run("llm", {"goal": "Read three pages.", "tools": ["echo"]}))
        assert run.status == "succeeded", run.error
        with page_for(browser, live_server.url) as (page, seen):
            login(page, "victor")
            page.goto(f"/runs/{run.pk}/steps/3/")
            page.get_by_text("The request as sent to the model").click()
            page.wait_for_url(f"**/runs/{run.pk}/steps/3/request/")
            assert page.locator("ol.messages > li.msg").count() == 6
            assert page.locator("li.msg.added").count() == 2
            assert "2 messages added, none fell out" in page.locator("main").inner_text()
            shot(page, "model-request")
            page.set_viewport_size({"width": 390, "height": 844})
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, width
            shot(page, "model-request-phone")
