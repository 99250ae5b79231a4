"""The run list in a real browser: label chips filter it, the error column and the statuses
read at a glance; the run page shows the labels and opens the input."""

from __future__ import annotations

import re

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run
from tests.base import calls, drive, final, make_people, script
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def run(goal, steps, labels, *, go=True, user=None):
    started = services.start_run("scripted", script(*steps, goal=goal), labels=labels, user=user)
    return drive(started, through_backoff=True) if go else started


def a_morning_of_runs(operator):
    stale = {"story": "stale-cart", "customer": "ben"}
    made = {
        "retried": run(
            "Quote shipping for order 1042",
            [calls({"tool": "flaky", "args": {"failures": 1}}), final("quoted")],
            {**stale, "fault": "shipping-timeout"},
        ),
        "failed": run(
            "Reserve STOVE-1 for the trip",
            [
                calls({"tool": "echo", "args": {"cart": ["STOVE-1", "TENT-2P"]}}),
                calls({"tool": "fail", "args": {"message": "STOVE-1 is no longer in the cart"}}),
            ],
            stale,
        ),
        "cancelled": run(
            "Recommend a sleeping bag",
            [calls({"tool": "echo", "args": {"x": 1}}), final()],
            stale,
            go=False,
        ),
        "happy": run(
            "Get me ready for a weekend camping trip",
            [calls({"tool": "echo", "args": {"x": 1}}), final("packed")],
            {"story": "happy-path", "customer": "ana"},
        ),
    }
    services.cancel_run(made["cancelled"], user=operator, reason="customer left")
    # An error long and hostile enough to test the column: markup and a second line.
    Run.objects.filter(pk=made["failed"].pk).update(
        error="fail: STOVE-1 is no longer in the cart <b>(removed after step 2)</b>\n"
        + "while reserving " * 20
    )
    return made


def status(row) -> tuple[str, str]:
    badge = row.locator("td.status .badge")
    mark = badge.evaluate("e => getComputedStyle(e, '::before').content")
    return mark.strip('"').strip(), badge.inner_text()


def colours(row) -> tuple[str, str]:
    return row.locator("td.status .badge").evaluate(
        "e => [getComputedStyle(e).backgroundImage + getComputedStyle(e).backgroundColor,"
        " getComputedStyle(e).color].join(' ')"
    ), ""


def test_label_chips_filter_the_list_and_the_error_column_reads_at_a_glance(live_server, browser):
    people = make_people()
    made = a_morning_of_runs(people["operator"])

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        settle(page)
        assert_inert(page)
        assert page.locator("#run-rows tr").count() == 4
        failed_row = page.locator("#run-rows tr", has_text=str(made["failed"].pk)[:8])
        error = failed_row.locator("td.err")
        assert error.inner_text().startswith("fail: STOVE-1 is no longer in the cart <b>")
        assert error.locator("b").count() == 0  # shown as text, not markup
        assert "\n" not in error.inner_text()
        box = error.locator(".clip").bounding_box()
        assert box is not None and box["height"] < 22  # one line, clipped
        retried = page.locator("#run-rows tr", has_text=str(made["retried"].pk)[:8])
        cancelled = page.locator("#run-rows tr", has_text=str(made["cancelled"].pk)[:8])
        happy = page.locator("#run-rows tr", has_text=str(made["happy"].pk)[:8])
        # Told apart by a mark as well as by colour.
        assert status(retried) == ("↻", "succeeded · retried")
        assert status(happy) == ("✓", "succeeded")
        assert status(cancelled) == ("⊘", "cancelled")
        assert status(failed_row) == ("✕", "failed")
        assert len({colours(row) for row in (retried, happy, cancelled, failed_row)}) == 4
        shot(page, "run-list-labels")

        failed_row.locator("a.lchip", has_text="story=stale-cart").click()
        page.wait_for_url(re.compile(r"/\?label=story%3Dstale-cart$"))
        settle(page)
        assert page.locator("#run-rows tr").count() == 3
        assert (
            page.locator(".label-filters .lchip.active").inner_text().startswith("story=stale-cart")
        )
        retried.locator("a.lchip", has_text="fault=shipping-timeout").click()
        page.wait_for_url(re.compile(r"label=fault%3Dshipping-timeout"))
        assert page.locator("#run-rows tr").count() == 1
        shot(page, "run-list-labels-filtered")

        # Drop the first filter: the other stays.
        page.locator(".label-filters .lchip.active", has_text="story=stale-cart").locator(
            ".lchip-x"
        ).click()
        page.wait_for_url(re.compile(r"/\?label=fault%3Dshipping-timeout$"))
        assert page.locator("#run-rows tr").count() == 1

        # Typed into the filter bar, with the status filter.
        page.goto("/")
        page.fill("input[name=label]", "customer=ben")
        page.select_option("select[name=status]", "failed")
        page.click(".filters button[type=submit]")
        page.wait_for_load_state("networkidle")
        rows = page.locator("#run-rows tr")
        assert rows.count() == 1 and str(made["failed"].pk)[:8] in rows.inner_text()

        # The run page: its labels, and its input one click away.
        rows.locator("a", has_text=str(made["failed"].pk)[:8]).first.click()
        page.wait_for_url(f"**/runs/{made['failed'].pk}/")
        settle(page)
        assert page.locator(".runlabels .lchip").all_inner_texts() == [
            "customer=ben",
            "story=stale-cart",
        ]
        panel = page.locator("#run-input")
        assert not panel.locator(".input-body").is_visible()
        panel.locator("summary").first.click()
        assert panel.locator(".input-body").is_visible()
        assert (
            "STOVE-1" in panel.inner_text() and "Reserve STOVE-1 for the trip" in panel.inner_text()
        )
        assert_inert(page)
        shot(page, "run-page-labels-input", full_page=False)
        page.locator(".runlabels .lchip", has_text="story=stale-cart").click()
        page.wait_for_url(re.compile(r"/\?label=story%3Dstale-cart$"))
        assert page.locator("#run-rows tr").count() == 3

        assert watch.errors == [] and watch.dialogs == []
        assert watch.unexpected_requests() == []
