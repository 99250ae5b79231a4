"""Every page at a phone's width (390 px): nothing makes the page itself scroll sideways.

Wide tables and long values may scroll inside their own box; the page may not.
Screenshots of each page at 390 px and at desktop width land in tests/screenshots/.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.lifecycle import retention, services
from agentrun.models import Run
from agentrun.security.roles import create_user
from agentrun.store import snapshots
from tests.base import PASSWORD, drive, make_in_flight
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = (390, 844)
DESKTOP = (1440, 900)

# How far the page scrolls sideways, and the elements that stick out past the viewport.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width && box.right > width + 1) {
      // Inside a box that scrolls sideways or clips is fine: the page itself does not move.
      let p = el.parentElement, contained = false;
      while (p && p !== document.body) {
        const ox = getComputedStyle(p).overflowX;
        if (ox === 'auto' || ox === 'scroll' || ox === 'hidden' || ox === 'clip') { contained = true; break; }
        p = p.parentElement;
      }
      if (!contained) out.push(el.tagName.toLowerCase() + '.' + [...el.classList].join('.') + ' right=' + Math.round(box.right));
    }
  }
  return {scroll: document.documentElement.scrollWidth, width, out: out.slice(0, 8)};
}"""


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def pages(people):
    """Each debugger page by name, with the runs it needs."""
    run = runs.walkthrough_run(people["operator"])
    other = runs.walkthrough_run(people["operator"], evidence="signed delivery note")
    state = snapshots.load(run.pk, 3, "pre")
    state["memory"]["goal"] = "Refund order 1042; hold no stock and write to the customer first"
    # A big diff on the compare page: 120 notes in one group, which starts folded.
    state["memory"]["notes"].update({f"n{i:03}": f"packing item {i}" for i in range(120)})
    fork = drive(
        services.fork_run(
            run, step=3, at="pre", state=state, reason="try without stock", user=people["operator"]
        )
    )
    # The Now page and the run list with steps in flight on two workers.
    make_in_flight("acting", 3, worker="worker-host-with-a-long-name.example.internal:4242")
    make_in_flight("backoff", 2, waited=90.0)
    # A run that retention purged: its tombstone page.
    old = runs.walkthrough_run(people["operator"], evidence="an old delivery note")
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=60))
    assert retention.purge(timedelta(days=30)).runs == 1
    return {
        "run-list": "/",
        "run": f"/runs/{run.pk}/",
        "step": f"/runs/{run.pk}/steps/4/",
        "snapshot": f"/runs/{run.pk}/steps/4/post/",
        "step-diff": f"/runs/{run.pk}/steps/6/diff/",
        "diff": f"/diff/?a={run.pk}:1:post&b={other.pk}:1:post",
        "compare": f"/runs/{fork.pk}/compare/",
        "compare-picker": f"/runs/{run.pk}/compare/",
        "fork": f"/runs/{run.pk}/steps/4/pre/fork/",
        "search": f"/runs/{run.pk}/?q=refund",
        "watch": f"/runs/{run.pk}/watch/?path=memory.notes",
        # Changes with their replay buttons: the parent's, and the fork's edit before step 3.
        "watch-fork": f"/runs/{fork.pk}/watch/?path=memory.goal",
        "compare-watch": f"/runs/{fork.pk}/compare/?path=memory.goal",
        "purged": f"/runs/{old.pk}/",
        "now": "/now/",
        "audit": "/audit/",
        "404": f"/runs/{uuid.uuid4()}/",
    }


def overflow(page) -> dict | None:
    """What sticks out when the page scrolls sideways; None when it does not."""
    found = page.evaluate(OVERFLOW)
    return found if found["scroll"] > PHONE[0] else None


def test_every_page_fits_a_390_px_phone(live_server, browser, pages):
    problems = {}
    with page_for(browser, live_server.url, *PHONE) as (page, _watch):
        page.goto("/login/")
        problems["login"] = overflow(page)
        shot(page, "phone-login")
        login(page, "olga")
        for name, url in pages.items():
            page.goto(url)
            settle(page)
            problems[name] = overflow(page)
            shot(page, f"phone-{name}")
        assert {k: v for k, v in problems.items() if v} == {}
        assert len(problems) == len(pages) + 1


def test_a_long_user_name_and_log_out_stay_in_the_nav_bar(live_server, browser, people):
    create_user("margarethe.vandenberg-operations", "admin", PASSWORD)
    with page_for(browser, live_server.url, *PHONE) as (page, _watch):
        login(page, "margarethe.vandenberg-operations")
        page.goto("/")
        bar = page.locator(".topbar").bounding_box()
        for selector in (".who .user", ".who .role", ".who .linkish", ".mainnav a:last-child"):
            box = page.locator(selector).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE[0], selector
            assert box["y"] >= bar["y"] and box["y"] + box["height"] <= bar["y"] + bar["height"]
        assert overflow(page) is None
        shot(page, "phone-nav-long-name", full_page=False)
        page.click(".who .linkish")
        page.wait_for_url("**/login/**")


def test_the_same_pages_at_desktop_width(live_server, browser, pages):
    with page_for(browser, live_server.url, *DESKTOP) as (page, _watch):
        login(page, "olga")
        for name, url in pages.items():
            page.goto(url)
            settle(page)
            found = page.evaluate(OVERFLOW)
            assert found["scroll"] <= DESKTOP[0], f"{name}: {found}"
            shot(page, f"desktop-{name}", full_page=False)
