"""Headless Chromium for the debugger's browser tests (Playwright's sync API).

Uses Debian's /usr/bin/chromium. Without it the tests skip with a reason,
unless CI=true, where a missing browser is a failure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import connections

from tests.base import PASSWORD

# Playwright's sync API runs an event loop in this thread; Django's ORM calls from the test
# body are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "screenshots"

# Every request the debugger's own pages may make. Anything else (another host, /api/...) fails.
ALLOWED_PATHS = re.compile(
    r"^/(?:$|login/|logout/|diff/|now/$|audit/(?:export\.csv)?$|static/.+"
    r"|batches/(?:$|new/$|[0-9a-f-]{36}/(?:$|cancel/|promote/))"
    r"|runs/[0-9a-f-]{36}/(?:$|live/|cancel/|approval/|compare/|pin/|unpin/|watch/|export/|input/"
    r"|steps/\d+/(?:$|diff/|request/|pre/(?:fork/(?:check/)?)?$|post/(?:fork/(?:check/)?)?$|pre\.json|post\.json)))"
)


def require_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing and CI=true: install Debian's chromium package")
    pytest.skip(
        f"{CHROMIUM} is missing (apt-get install chromium); set CI=true to make this a failure"
    )


@dataclass
class Watch:
    """What a page did besides what the test asked for."""

    origin: str
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def unexpected_requests(self) -> list[str]:
        bad = []
        for url in self.requests:
            parts = urlsplit(url)
            if url.startswith("data:"):
                continue
            if f"{parts.scheme}://{parts.netloc}" != self.origin or not ALLOWED_PATHS.match(
                parts.path
            ):
                bad.append(url)
        return bad


@contextmanager
def chromium() -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
            # ORM calls made while Playwright runs get their own connection (another context):
            # close it, or the test database can't be dropped at the end.
            connections.close_all()


@contextmanager
def page_for(
    browser: Any, base_url: str, width: int = 1440, height: int = 900
) -> Iterator[tuple[Any, Watch]]:
    """A fresh context (no cookies) and page that records requests, dialogs and errors."""
    context = browser.new_context(viewport={"width": width, "height": height}, base_url=base_url)
    page = context.new_page()
    page.set_default_timeout(10_000)
    watch = Watch(origin=base_url.rstrip("/"))
    page.on("request", lambda request: watch.requests.append(request.url))

    def on_dialog(dialog: Any) -> None:
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda exc: watch.errors.append(str(exc)))
    page.on("console", lambda msg: watch.errors.append(msg.text) if msg.type == "error" else None)
    try:
        yield page, watch
    finally:
        context.close()


def login(page: Any, username: str, password: str = PASSWORD) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")


def shot(page: Any, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def settle(page: Any) -> None:
    """Wait until htmx has no request in flight and no swap still settling.

    htmx removes `htmx-request` before the swap settles (20 ms later); the page's own
    afterSettle handlers (the selected row, the flagged entry) run only then."""
    page.wait_for_load_state("networkidle")
    page.wait_for_function(
        "() => !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')"
    )


INERT_CHECK = """() => {
  const all = [...document.querySelectorAll('*')];
  return {
    inline_scripts: document.querySelectorAll('script:not([src])').length,
    images: document.querySelectorAll('img, svg image, iframe, object, embed').length,
    handlers: all.filter(e => [...e.attributes].some(a => /^(on|hx-on|data-hx-on)/i.test(a.name))).map(e => e.outerHTML.slice(0, 120)),
    js_links: document.querySelectorAll('a[href^="javascript:" i]').length,
    api_hx: all.filter(e => [...e.attributes].some(a => /^(data-)?hx-(get|post|put|delete|patch)$/.test(a.name) && !a.value.startsWith('/runs/') && !a.value.startsWith('/now/') && !a.value.startsWith('/batches/') && !a.value.startsWith('/?') && a.value !== '/')).map(e => e.outerHTML.slice(0, 120)),
  };
}"""


def assert_inert(page: Any) -> None:
    """Nothing from a run became markup: no inline script, handler, image, js: link or foreign hx- request."""
    found = page.evaluate(INERT_CHECK)
    assert found == {
        "inline_scripts": 0,
        "images": 0,
        "handlers": [],
        "js_links": 0,
        "api_hx": [],
    }, page.url
