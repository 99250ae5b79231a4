"""At a phone's width (390 px) the run list, the audit, the Now page and the batch pages are
cards: each run's status, id, goal (or summary) and error in view, no table wider than its
box; a step's attempts fit. At desktop width they are tables as before."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import batches
from agentrun.lifecycle import labels as run_labels
from agentrun.models import Run
from tests.base import make_in_flight
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = (390, 844)
DESKTOP = (1440, 900)

# Every table (and its scrolling box) against its own width, and the page's.
WIDTHS = """() => ({
  page: document.documentElement.scrollWidth,
  tables: [...document.querySelectorAll('main table, main .scroll-x')].map(t => ({
    what: t.tagName.toLowerCase() + '.' + [...t.classList].join('.'),
    scroll: t.scrollWidth, client: t.clientWidth})),
})"""

# For each run row: the cells that must be readable, where they are and whether cut off.
RUN_CELLS = """() => [...document.querySelectorAll('#run-rows tr')].map(tr => {
  const out = {};
  for (const [name, sel] of [['status', 'td.status'], ['id', 'td.run-id a'], ['goal', 'td.goal .clip'], ['error', 'td.err']]) {
    const el = tr.querySelector(sel);
    if (!el) { out[name] = null; continue; }
    const box = el.getBoundingClientRect();
    out[name] = {text: el.innerText.trim(), left: box.left, right: box.right, width: box.width,
                 cut: el.scrollWidth > el.clientWidth + 1};
  }
  return out;
})"""

ATTEMPT_HEADS = """() => [...document.querySelectorAll('.attempts')].flatMap(t => {
  const call = t.closest('.call').getBoundingClientRect();
  return [...t.querySelectorAll('th')].map(th => ({text: th.innerText,
    cut: th.scrollWidth > th.clientWidth + 1, right: th.getBoundingClientRect().right,
    inside: th.getBoundingClientRect().right <= call.right + 1}));
})"""

LONG_ERROR = "warehouse API returned 503 " + "and then some more words of the error " * 6


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def seen(people):
    operator = people["operator"]
    ok = runs.walkthrough_run(operator)
    run_labels.store(ok, {"problem": "stale-cart", "customer": "ben"})
    failed = runs.failing_run(operator)
    Run.objects.filter(pk=failed.pk).update(error=LONG_ERROR)
    # A run of an agent with no goal in its input: its summary instead.
    Run.objects.create(agent="inventory", input={"sku": "SHELF-42-LEFT", "qty": 3})
    make_in_flight("acting", 2, worker="worker-host-with-a-long-name.example.internal:4242")
    make_in_flight("backoff", 1, waited=90.0)
    batch = batches.create(
        {"status": "failed"},
        name="INC-9: the warehouse outage of one long afternoon",
        user=operator,
    )
    return {"ok": ok, "failed": failed, "batch": batch}


def fits(found: dict) -> list[dict]:
    return [t for t in found["tables"] if t["scroll"] > t["client"] + 1]


def test_at_390_px_runs_audit_and_now_are_cards_with_nothing_off_to_the_side(
    live_server, browser, seen
):
    with page_for(browser, live_server.url, *PHONE) as (page, watch):
        login(page, "olga")
        pages = [("run-list", "/"), ("audit", "/audit/"), ("now", "/now/")]
        pages += [("batches", "/batches/"), ("batch", f"/batches/{seen['batch'].pk}/")]
        for name, url in pages:
            page.goto(url)
            settle(page)
            found = page.evaluate(WIDTHS)
            assert found["page"] <= PHONE[0], (name, found)
            assert found["tables"], name
            assert fits(found) == [], (name, found)
            shot(page, f"phone-cards-{name}")

        page.goto("/")
        settle(page)
        rows = page.evaluate(RUN_CELLS)
        assert len(rows) == Run.objects.count()
        for row in rows:
            for name in ("status", "id", "goal", "error"):
                cell = row[name]
                assert cell is not None and cell["width"] > 0, (name, row)
                assert cell["left"] >= 0 and cell["right"] <= PHONE[0], (name, row)
            assert row["id"]["text"] and row["status"]["text"]
            assert not row["goal"]["cut"] and not row["error"]["cut"], row
        goals = {r["goal"]["text"] for r in rows}
        assert "Refund order 1042 and hold replacement stock" in goals
        assert "sku: SHELF-42-LEFT" in goals  # the summary of a run without a goal
        errors = [r["error"]["text"] for r in rows if "warehouse API" in r["error"]["text"]]
        assert errors and errors[0].startswith("warehouse API returned 503")

        # A step's attempts: every heading whole, inside its call.
        page.goto(f"/runs/{seen['ok'].pk}/steps/2/")
        settle(page)
        heads = page.evaluate(ATTEMPT_HEADS)
        assert [h["text"].upper() for h in heads[:5]] == [
            "#",
            "STARTED",
            "TOOK",
            "OUTCOME",
            "BACKOFF",
        ]
        assert all(not h["cut"] and h["inside"] and h["right"] <= PHONE[0] for h in heads), heads
        page.locator(".call").first.scroll_into_view_if_needed()
        shot(page, "phone-cards-step", full_page=False)
    assert watch.errors == []


def test_at_desktop_width_they_stay_tables(live_server, browser, seen):
    with page_for(browser, live_server.url, *DESKTOP) as (page, _watch):
        login(page, "olga")
        for name, url in (("run-list", "/"), ("audit", "/audit/"), ("now", "/now/")):
            page.goto(url)
            settle(page)
            shown = page.evaluate(
                "() => [...document.querySelectorAll('table.grid.cards')].map("
                "t => [getComputedStyle(t).display, getComputedStyle(t.querySelector('thead')).display])"
            )
            assert shown and all(d == ["table", "table-header-group"] for d in shown), (name, shown)
            shot(page, f"desktop-cards-{name}", full_page=False)
