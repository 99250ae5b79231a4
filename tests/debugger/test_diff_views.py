"""Diff pages: pre → post of a step, and any two snapshots of one or two runs."""

from __future__ import annotations

import pytest

from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


def test_a_step_diff_shows_what_the_step_changed(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/6/diff/")
    diff = response.context["diff"]
    assert diff.summary == "6 added, 1 changed across decisions, history, iteration, tool_calls"
    html = response.content.decode()
    assert "What step 6 changed" in html
    assert 'class="chg chg-appended"' in html and "3 appended" in html
    assert (
        f'href="/runs/{run.pk}/steps/5/diff/"' in html
        and f'href="/runs/{run.pk}/steps/7/diff/"' in html
    )


def test_two_runs_compare_at_any_snapshots_with_an_inline_text_diff(client_for, people):
    a = runs.walkthrough_run(people["operator"])
    b = runs.walkthrough_run(people["operator"], evidence="signed delivery note")
    response = client_for("viewer").get(f"/diff/?a={a.pk}:1:post&b={b.pk}:1:post")
    assert response.status_code == 200
    diff = response.context["diff"]
    assert diff.summary == "4 changed across history, tool_calls"
    html = response.content.decode()
    assert "<del>photo</del><ins>signed delivery note</ins>" in html


def test_identical_snapshots_say_so(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("viewer").get(f"/diff/?a={run.pk}:2:post&b={run.pk}:3:pre")
    assert response.context["diff"].summary == "identical"


def test_a_malformed_reference_is_a_400_with_the_reason(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    client = client_for("viewer")
    response = client.get(f"/diff/?a={run.pk}:one:pre&b={run.pk}:1:post")
    assert response.status_code == 400
    assert b"is not &lt;run-id&gt;:&lt;step&gt;:&lt;pre|post&gt;" in response.content
    assert client.get(f"/diff/?a=nope:1:pre&b={run.pk}:1:post").status_code == 400
    assert client.get(f"/diff/?a={run.pk}:99:pre&b={run.pk}:1:post").status_code == 404


def test_the_compare_page_starts_empty_with_a_form(client_for, people):
    response = client_for("viewer").get("/diff/")
    assert response.status_code == 200
    assert b'name="a"' in response.content and b'name="b"' in response.content


def test_htmx_gets_only_the_pane(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    body = (
        client_for("viewer")
        .get(f"/runs/{run.pk}/steps/2/diff/", **hx("snap-pane"))
        .content.decode()
    )
    assert "<html" not in body and '<ol class="diff" hx-disable>' in body
