"""An operator compares runs by the short ids the pages show, or picks one from the list."""

from __future__ import annotations

import uuid

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run
from tests.base import drive
from tests.debugger import runs
from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def family(people):
    """A run, two sandbox forks of it from step 4, and two runs whose ids share 8 characters."""
    parent = runs.walkthrough_run(people["operator"])
    fork = drive(services.fork_run(parent, step=4, user=people["operator"]))
    sibling = drive(services.fork_run(parent, step=4, at="pre", user=people["operator"]))
    twins = [
        Run.objects.create(id=uuid.UUID(f"abcd0000-0000-4000-8000-00000000000{n}"), agent="x")
        for n in (1, 2)
    ]
    return parent, fork, sibling, twins


def heading(page) -> str:
    return " ".join(page.inner_text(".page-head h1").split())


def test_compare_with_a_typed_short_id_and_with_the_picker(live_server, browser, family):
    parent, fork, sibling, twins = family
    short = str(sibling.pk)[:8]
    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{fork.pk}/compare/")
        assert heading(page) == f"Compare {str(fork.pk)[:8]} with its parent {str(parent.pk)[:8]}"

        # The 8 characters the pages show are enough.
        page.fill("input[name=with]", short)
        page.click("button:has-text('Compare with')")
        page.wait_for_load_state("networkidle")
        assert heading(page) == f"Compare {str(fork.pk)[:8]} with {short}"
        assert page.locator(".compare-split").count() == 1

        # Four characters shared by two runs: the error lists both, each a link.
        page.fill("input[name=with]", "abcd")
        page.click("button:has-text('Compare with')")
        page.wait_for_load_state("networkidle")
        alert = page.inner_text("[role=alert]")
        assert "matches several runs" in alert and "give more characters" in alert
        candidates = page.locator("ul.candidates a")
        assert sorted(candidates.all_inner_texts()) == ["abcd0000", "abcd0000"]
        shot(page, "50-compare-ambiguous-id", full_page=False)
        candidates.first.click()
        page.wait_for_load_state("networkidle")
        assert heading(page).endswith("with abcd0000")

        # Unknown: said so, nothing compared.
        page.fill("input[name=with]", "ffff0")
        page.click("button:has-text('Compare with')")
        page.wait_for_load_state("networkidle")
        assert "no run has an id starting with 'ffff0'" in page.inner_text("[role=alert]")

        # The picker: the parent under "Lineage", the sibling under "Sibling forks".
        page.goto(f"/runs/{fork.pk}/compare/?with={short}")
        page.click("details.picker > summary")
        lineage = page.locator(".pick-group[aria-label=Lineage]")
        assert lineage.locator("a.pick").all_inner_texts() == [str(parent.pk)[:8]]
        siblings = page.locator(".pick-group[aria-label='Sibling forks'] li")
        assert "(shown)" in siblings.inner_text()  # the run compared with now is marked
        shot(page, "51-compare-picker")
        lineage.locator("a.pick").click()
        page.wait_for_load_state("networkidle")
        assert heading(page) == f"Compare {str(fork.pk)[:8]} with its parent {str(parent.pk)[:8]}"

        # From the parent, its forks are offered; picking one compares and shows a step's diff.
        page.goto(f"/runs/{parent.pk}/compare/")
        assert page.locator("details.picker[open]").count() == 1  # nothing compared: open
        page.click(f".pick-group[aria-label=Lineage] a.pick:has-text('{str(fork.pk)[:8]}')")
        page.wait_for_load_state("networkidle")
        assert heading(page) == f"Compare {str(parent.pk)[:8]} with {str(fork.pk)[:8]}"
        page.click("#compare-rows a.crow[data-n='6']")
        settle(page)
        page.wait_for_selector("#compare-diff[data-step='6'] .diffhead")
        assert_inert(page)
        # The two refused ids were 400s (the console says so); nothing else went wrong.
        assert [e for e in watch.errors if "status of 400" not in e] == []
        assert len(watch.errors) == 2 and watch.unexpected_requests() == []


def test_the_snapshot_diff_takes_short_ids(live_server, browser, family):
    parent, fork, _sibling, _twins = family
    with page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto("/diff/")
        page.fill("input[name=a]", f"{str(parent.pk)[:8]}:6:post")
        page.fill("input[name=b]", f"{str(fork.pk)[:6]}:6:post")
        page.click("button:has-text('Compare')")
        page.wait_for_load_state("networkidle")
        assert page.locator(".diffhead .summary").count() == 1
        assert page.inner_text(".diffhead .sub").startswith(
            f"{str(parent.pk)[:8]}:6:post → {str(fork.pk)[:8]}:6:post"
        )
        page.fill("input[name=a]", "abcd:1:post")
        page.click("button:has-text('Compare')")
        page.wait_for_load_state("networkidle")
        assert "matches several runs" in page.inner_text(".filters .error-text")
        shot(page, "52-diff-short-ids", full_page=False)
        assert [e for e in watch.errors if "status of 400" not in e] == []
