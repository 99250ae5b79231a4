"""Where a run page opens, in a real browser: on what the operator came for."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from tests.base import calls, drive, final, make_people, script
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def played(*steps, goal):
    return drive(services.start_run("scripted", script(*steps, goal=goal)), through_backoff=True)


def test_a_failed_run_opens_on_its_failed_step_and_a_retried_one_on_its_retry(live_server, browser):
    make_people()
    # Step 1 backs off once and succeeds; step 3 fails the run. The failure wins.
    failed = played(
        calls({"tool": "flaky", "args": {"failures": 1}}),
        calls({"tool": "echo", "args": {"cart": ["STOVE-1"]}}),
        calls({"tool": "fail", "args": {"message": "STOVE-1 is no longer in the cart"}}),
        goal="Reserve STOVE-1",
    )
    assert failed.status == "failed"
    # No failure: the retried step, not the last one.
    retried = played(
        calls({"tool": "echo", "args": {"x": 1}}),
        calls({"tool": "flaky", "args": {"failures": 1}}),
        calls({"tool": "echo", "args": {"x": 2}}),
        final("done"),
        goal="Quote shipping",
    )
    assert retried.status == "succeeded"

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{failed.pk}/")
        settle(page)
        assert_inert(page)
        body = page.locator("#step-body")
        assert body.get_attribute("data-step") == "3"
        assert "STOVE-1 is no longer in the cart" in body.inner_text()
        # The selected row of the step list is the failed step's.
        assert page.locator("#step-list .sel[data-n]").first.get_attribute("data-n") == "3"
        shot(page, "80-opens-on-failed-step")

        page.goto(f"/runs/{retried.pk}/")
        settle(page)
        assert page.locator("#step-body").get_attribute("data-step") == "2"
        shot(page, "81-opens-on-retried-step")

        # A deep link still opens its own step.
        page.goto(f"/runs/{failed.pk}/steps/1/")
        settle(page)
        assert page.locator("#step-body").get_attribute("data-step") == "1"

    assert watch.unexpected_requests() == []
    assert watch.errors == []
