"""The run list's "Replay these runs": an operator's button to the new batch page, with
the list's filter in its address; viewers don't see it."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.debugger import runs

pytestmark = pytest.mark.django_db


def test_an_operator_replays_the_runs_the_list_shows(client_for, people):
    runs.failing_run(people["operator"])
    response = client_for("operator").get(
        "/", {"status": "failed", "tool_failed": "fail", "label": ["team=ops"], "page": "1"}
    )
    assert response.context["replay_url"] == ""  # a label no run has: nothing to replay
    response = client_for("operator").get("/", {"status": "failed", "tool_failed": "fail"})
    url = response.context["replay_url"]
    assert f'href="{url.replace("&", "&amp;")}" data-action="replay-batch"' in (
        response.content.decode()
    )
    parts = urlsplit(url)
    assert parts.path == "/batches/new/"
    assert parse_qs(parts.query) == {"status": ["failed"], "tool_failed": ["fail"]}


def test_a_viewer_does_not_see_the_replay_button(client_for, people):
    runs.failing_run(people["operator"])
    html = client_for("viewer").get("/?status=failed").content.decode()
    assert "Replay these runs" not in html and "/batches/new/" not in html
