"""Pre and post snapshots: a JSON tree per URL, subtrees, JSON download."""

from __future__ import annotations

import json

import pytest

from agentrun.store import snapshots
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people):
    return runs.walkthrough_run(people["operator"])


def test_each_snapshot_has_a_page_with_its_state_as_a_tree(client_for, run):
    client = client_for("viewer")
    for at in ("pre", "post"):
        response = client.get(f"/runs/{run.pk}/steps/6/{at}/")
        assert response.status_code == 200
        html = response.content.decode()
        assert f"{at.capitalize()} state of step 6" in html
        assert '<span class="jt-key">history</span>' in html
        assert 'data-path="memory.goal"' in html  # copy-path buttons
        assert "object · 11 keys" in html
    post = client.get(f"/runs/{run.pk}/steps/6/post/").content.decode()
    assert "Re-read the order with the new evidence" in post
    pre = client.get(f"/runs/{run.pk}/steps/6/pre/").content.decode()
    assert "Re-read the order with the new evidence" not in pre


def test_a_subtree_opens_by_path_with_breadcrumbs(client_for, run):
    client = client_for("viewer")
    html = client.get(f"/runs/{run.pk}/steps/6/post/?path=tool_calls[5].args").content.decode()
    assert 'class="pathcrumbs"' in html
    assert "tool_calls" in html and "video" in html
    assert '<span class="jt-key">history</span>' not in html
    assert client.get(f"/runs/{run.pk}/steps/6/post/?path=tool_calls[99]").status_code == 404
    assert client.get(f"/runs/{run.pk}/steps/6/post/?path=..bad").status_code == 404


def test_big_lists_show_the_newest_items_and_page_through_the_rest(client_for, people):
    from tests.base import calls, drive, final, make_run, script

    steps = [calls({"tool": "echo", "args": {"i": i}}) for i in range(120)] + [final()]
    run = drive(make_run(script(*steps)), max_steps=200)
    client = client_for("viewer")
    html = client.get(f"/runs/{run.pk}/steps/121/post/?path=history").content.decode()
    assert "earlier" in html and "from=" in html
    assert 'data-path="history[241]"' in html and 'data-path="history[0]"' not in html
    first = client.get(f"/runs/{run.pk}/steps/121/post/?path=history&from=0").content.decode()
    assert 'data-path="history[0]"' in first and "more" in first


def test_the_download_is_the_exact_state_as_json(client_for, run):
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/6/post.json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/json")
    assert (
        response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-step-6-post.json"'
    )
    assert json.loads(response.content) == snapshots.load(run.pk, 6, "post")


def test_htmx_gets_only_the_pane(client_for, run):
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/6/pre/", **hx("snap-pane"))
    body = response.content.decode()
    assert "<html" not in body and 'class="tree-wrap" hx-disable' in body
    assert f'hx-get="/runs/{run.pk}/steps/6/post/" hx-target="#snap-pane"' in body


def test_a_step_still_running_has_no_post_snapshot(client_for, people):
    run = runs.waiting_run(people["operator"])
    client = client_for("viewer")
    assert client.get(f"/runs/{run.pk}/steps/2/pre/").status_code == 200
    assert client.get(f"/runs/{run.pk}/steps/2/post/").status_code == 404
    assert client.get(f"/runs/{run.pk}/steps/2/diff/").status_code == 404
    body = client.get(f"/runs/{run.pk}/steps/2/", **hx("step-body")).content.decode()
    assert f'id="snap-pane" hx-get="/runs/{run.pk}/steps/2/pre/"' in body
