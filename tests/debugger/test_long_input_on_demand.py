"""A long input stays cheap: a 10,000-step run started with a 10,000-item script has a run
page under 200 KB. Its input is not drawn in the page; the panel fetches its tree (htmx)
when it is opened, and the link works without htmx too."""

from __future__ import annotations

import re

import pytest

from agentrun.models import Run
from tests.debugger.conftest import hx
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db

STEPS = 10_000


def script(n: int) -> dict:
    steps = [
        {"thought": f"step {i}", "calls": [{"tool": "lookup", "args": {"key": f"item-{i}"}}]}
        for i in range(1, n)
    ]
    return {"goal": f"{n}-step script", "steps": [*steps, {"thought": "done", "final": "ok"}]}


@pytest.fixture
def long_input_run(people):
    run = long_run(people["operator"], STEPS)
    Run.objects.filter(pk=run.pk).update(input=script(STEPS))
    return run


def test_the_run_page_of_a_10000_item_input_is_under_200_kb(client_for, long_input_run):
    response = client_for("viewer").get(f"/runs/{long_input_run.pk}/")
    size = len(response.content)
    print(f"run page: {size:,} bytes")

    assert response.status_code == 200
    assert size < 200_000
    html = response.content.decode()
    assert "item-9998" not in html  # the tree is not in the page
    panel = html.split('id="run-input"', 1)[1].split("</details>", 1)[0]
    url = f"/runs/{long_input_run.pk}/input/"
    assert f'hx-get="{url}"' in panel and f'href="{url}"' in panel
    assert "10,000" in panel  # it says how much there is to load


def test_the_panel_loads_the_tree_as_a_fragment(client_for, long_input_run):
    client = client_for("viewer")
    response = client.get(f"/runs/{long_input_run.pk}/input/", **hx("run-input-tree"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and 'class="jt"' in html
    assert "item-9998" in html  # the newest items of the list, as every tree opens lists


def test_without_htmx_the_link_is_a_page_of_its_own(client_for, long_input_run):
    response = client_for("viewer").get(f"/runs/{long_input_run.pk}/input/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html and "item-9998" in html


def test_a_short_input_is_still_drawn_in_the_page(client_for, people):
    run = long_run(people["operator"], 5)
    Run.objects.filter(pk=run.pk).update(input=script(5))
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    panel = html.split('id="run-input"', 1)[1].split("</details>\n", 1)[0]
    assert "item-3" in panel and "input-lazy" not in panel


def test_the_input_needs_a_role(client_for, long_input_run):
    assert client_for("outsider").get(f"/runs/{long_input_run.pk}/input/").status_code == 403


def test_secrets_in_a_long_input_stay_redacted(client_for, people):
    run = long_run(people["operator"], 3)
    value = script(2000)
    value["api_key"] = "sk-" + "x" * 40
    Run.objects.filter(pk=run.pk).update(input=value)
    html = client_for("viewer").get(f"/runs/{run.pk}/input/", **hx("run-input-tree"))
    assert "x" * 40 not in html.content.decode()
    assert re.search(r"REDACTED", html.content.decode())


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_opening_the_panel_in_a_browser_loads_the_tree(live_server):
    from tests.base import make_people
    from tests.debugger.browser import assert_inert, chromium, login, page_for, settle, shot

    people = make_people()
    run = long_run(people["operator"], 50, with_snapshots=True)
    Run.objects.filter(pk=run.pk).update(input=script(STEPS))
    with chromium() as browser, page_for(browser, live_server.url) as (page, watch):
        login(page, "victor")
        page.goto(f"/runs/{run.pk}/")
        assert page.locator("#run-input .jt").count() == 0
        page.click("#run-input summary")
        page.wait_for_selector("#run-input .jt")
        settle(page)
        assert "item-9998" in page.locator("#run-input").inner_html()
        assert "[9999]" in page.locator("#run-input").inner_text()
        shot(page, "long-input-opened", full_page=False)
        assert_inert(page)
        assert watch.unexpected_requests() == []
        assert watch.errors == [], (watch.errors, watch.requests)
