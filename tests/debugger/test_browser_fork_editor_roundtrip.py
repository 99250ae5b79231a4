"""The fork editor's JSON reader and writer give back what they read, byte for byte.

What the tree does not edit must reach the server unchanged: numbers as written,
keys in their order, and strings holding JSON in their own style (separators,
indentation, ASCII escapes) even when something inside them was edited.
"""

from __future__ import annotations

import json

import pytest

from tests.base import make_people
from tests.debugger import runs
from tests.debugger.browser import chromium, login, page_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

INNER = {"lines": [{"sku": "STOVE-1", "qty": 1, "price": 59.9}], "note": 'café "ok"', "n": None}
STYLES = {
    "default": json.dumps(INNER, ensure_ascii=False),
    "compact": json.dumps(INNER, separators=(",", ":"), ensure_ascii=False),
    "ascii": json.dumps(INNER),
    "indent2": json.dumps(INNER, indent=2, ensure_ascii=False),
    "indent4": json.dumps(INNER, indent=4),
    "empty_list": "[]",
    "padded": "  [1, 2]\n",
}
TRICKY = {
    "2": "keys that look like numbers keep their place",
    "1": 1.0,
    "big": 12345678901234567890,
    "small": 1e-07,
    "neg": -0.0,
    "text": 'line\nbreak\ttab \u2028 \x7f \x01 ✓ 😀 \\ "',
    "not json": "[not json]",
    "number text": "12",
    "empty": {},
    "list": [[], {}, [None, True, False]],
    "notes": STYLES,
}


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_what_is_read_is_written_back_exactly_edited_json_text_in_its_own_style(
    live_server, browser
):
    people = make_people()
    run = runs.walkthrough_run(people["operator"])
    text = json.dumps(TRICKY, indent=2, ensure_ascii=False)  # as the fork page writes a state

    with page_for(browser, live_server.url) as (page, watch):
        login(page, "olga")
        page.goto(f"/runs/{run.pk}/steps/3/pre/fork/")
        page.wait_for_selector("#fork-tree li[data-path='$']")
        rewrite = "([t, dirty]) => window.agentrunForkEditor.rewrite(t, dirty)"
        assert page.evaluate(rewrite, [text, False]) == text
        assert page.evaluate(rewrite, [text, True]) == text
        # The page's own state too: the tree's text is the server's text.
        state = page.input_value("#fork-state")
        assert page.evaluate(rewrite, [state, True]) == state

    assert watch.errors == []
