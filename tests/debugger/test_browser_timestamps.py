"""Timestamps: one format on every page (`Nov 29, 01:25:08`), the full time in a tooltip,
in the browser's time zone (the server's, UTC, without the script)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from agentrun.lifecycle import services
from agentrun.models import Event, Run, ToolCall
from tests.base import drive
from tests.debugger import runs
from tests.debugger.browser import chromium, login, settle, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ZONE = "Asia/Kolkata"  # UTC+05:30: an hour and a half-hour off, never mistaken for UTC
OFFSET = timedelta(hours=5, minutes=30)
FULL = re.compile(r"^[A-Z][a-z]{2} \d{1,2}, \d\d:\d\d:\d\d$")
MS = re.compile(r"^\d\d:\d\d:\d\d\.\d{3}$")
TITLE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+")

TIMES = """() => [...document.querySelectorAll('time[data-when]')].map(t => ({
  text: t.textContent, title: t.title, iso: t.getAttribute('datetime'),
  style: t.getAttribute('data-when'), local: t.hasAttribute('data-local')}))"""


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def approved(people):
    run = runs.waiting_run(people["operator"])
    services.decide_approval(run, user=people["operator"], decision="approve", comment="ok")
    return drive(run)


def expected(iso: str, style: str) -> str:
    from datetime import datetime

    moment = datetime.fromisoformat(iso) + OFFSET
    if style == "ms":
        return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return moment.strftime("%b %-d, %H:%M:%S")


def test_every_page_shows_times_in_the_browsers_zone_in_one_format(live_server, browser, approved):
    call = ToolCall.objects.get(run=approved, tool="ledger_write")
    assert isinstance(call.approval["at"], str)  # stored as ISO text: shown as a time too
    context = browser.new_context(
        viewport={"width": 1440, "height": 900}, base_url=live_server.url, timezone_id=ZONE
    )
    page = context.new_page()
    try:
        login(page, "olga")
        seen = {}
        for name, url in {
            "run-list": "/",
            "step": f"/runs/{approved.pk}/steps/2/",
            "audit": "/audit/",
            "snapshot": f"/runs/{approved.pk}/steps/2/post/",
        }.items():
            page.goto(url)
            settle(page)
            times = page.evaluate(TIMES)
            assert times, name
            for t in times:
                assert t["local"], (name, t)
                assert t["text"] == expected(t["iso"], t["style"]), (name, t)
                assert (FULL if t["style"] == "full" else MS).match(t["text"]), (name, t)
                assert TITLE.match(t["title"]) and not t["title"].endswith("UTC"), (name, t)
            text = page.inner_text("main")
            # No ISO stamps and no other format left in what the page shows.
            assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", text), name
            assert not re.search(r"\b\d{4}-\d\d-\d\d \d\d:\d\d", text), name
            seen[name] = times
            shot(page, f"timestamps-{name}", full_page=False)
        # The approval line of step 2: a time, not the ISO text it is stored as.
        page.goto(f"/runs/{approved.pk}/steps/2/")
        settle(page)
        line = page.locator("dd:has(.badge.cs-ok) time")
        assert line.count() == 1
        assert line.inner_text() == expected(call.approval["at"], "full")
        # The audit's operator actions carry the same format as the run list.
        assert any(t["style"] == "full" for t in seen["audit"])
        assert Event.objects.filter(run=approved, kind="approved").exists()
        assert Run.objects.get(pk=approved.pk).status == "succeeded"
    finally:
        context.close()


def test_without_the_script_the_server_writes_the_same_format_in_utc(client_for, approved):
    body = client_for("viewer").get("/audit/").content.decode()
    stamps = re.findall(
        r'<time datetime="([^"]+)" data-when="full" title="([^"]+)">([^<]+)</time>', body
    )
    assert stamps
    for iso, title, text in stamps:
        assert FULL.match(text) and title.endswith(" UTC") and iso.endswith("+00:00")
