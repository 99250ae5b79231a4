"""Run output is untrusted: every view and every htmx fragment escapes it."""

from __future__ import annotations

import json
import re

import pytest

from agentrun.lifecycle import services
from tests.base import drive
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db

# Each payload starts with "<" (or "</"): found verbatim, it would be markup.
RAW = [
    *runs.XSS.values(),
    "<script>alert",
    "<img src=x",
    '<a href="javascript:',
    "<button hx-on",
    '<div hx-get="/api',
]


def test_no_payload_reaches_the_html_unescaped(client_for, people):
    run = runs.hostile_run(people["operator"])
    runs.hostile_actions(people["operator"])
    client = client_for("operator")
    r = run.pk
    urls = [
        ("/", None),
        ("/", "run-rows"),
        (f"/runs/{r}/", None),
        (f"/runs/{r}/live/", "run-live"),
        ("/audit/", None),
        ("/audit/", "audit-actions"),
        (f"/diff/?a={r}:1:pre&b={r}:4:post", None),
    ]
    for n in range(1, 5):
        urls += [
            (f"/runs/{r}/steps/{n}/", None),
            (f"/runs/{r}/steps/{n}/", "step-body"),
            (f"/runs/{r}/steps/{n}/pre/", None),
            (f"/runs/{r}/steps/{n}/post/", "snap-pane"),
            (f"/runs/{r}/steps/{n}/diff/", None),
            (f"/runs/{r}/steps/{n}/diff/", "snap-pane"),
        ]
    fork = drive(services.fork_run(run, step=1, reason=runs.XSS["hx_on"], user=people["operator"]))
    f = fork.pk
    urls += [
        (f"/runs/{f}/", None),
        (f"/runs/{f}/compare/", None),
        (f"/runs/{f}/compare/?step=2", "compare-diff"),
        (f"/runs/{f}/compare/?with={r}&step=4", None),
        (f"/runs/{r}/compare/", None),
    ]
    urls += [
        (f"/runs/{r}/steps/{n}/{at}/fork/", None) for n in range(1, 5) for at in ("pre", "post")
    ]
    for url, target in urls:
        response = client.get(url, **(hx(target) if target else {}))
        assert response.status_code in (200, 286), url
        html = response.content.decode()
        for raw in RAW:
            assert raw not in html, (url, target, raw)
    page = client.get(f"/runs/{r}/steps/1/").content.decode()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    title = re.search(r"<title>(.*?)</title>", page, re.S).group(1)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in title


def test_the_json_download_is_json_not_html(client_for, people):
    run = runs.hostile_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/1/post.json")
    assert response["Content-Type"].startswith("application/json")
    assert response["X-Content-Type-Options"] == "nosniff"
    state = json.loads(response.content)
    assert state["tool_calls"][0]["args"]["json"] == runs.XSS["close_script"]  # verbatim, it's data


def test_containers_of_untrusted_content_disable_htmx(client_for, people):
    run = runs.hostile_run(people["operator"])
    html = client_for("viewer").get(f"/runs/{run.pk}/steps/1/").content.decode()
    assert '<span class="thought" hx-disable>' in html
    assert '<dl class="kv" hx-disable>' in html
    pane = (
        client_for("viewer")
        .get(f"/runs/{run.pk}/steps/1/post/", **hx("snap-pane"))
        .content.decode()
    )
    assert '<div class="tree-wrap" hx-disable>' in pane
