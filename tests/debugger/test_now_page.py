"""The Now page: every step in flight by state and worker, polled; and the run list's counts."""

from __future__ import annotations

import re

import pytest

from agentrun.models import Run, ToolCall
from debugger.templatetags.debugger_tags import waited
from tests.base import make_in_flight
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


def listed(html: str, state: str) -> list[str]:
    """Short run ids listed under one state's heading, in order."""
    section = re.search(rf'<section[^>]*id="state-{state}".*?</section>', html, re.S)
    if section is None:
        return []
    return re.findall(
        r'<td class="mono"[^>]*><a href="/runs/[^"]+">([0-9a-f]{8})</a>', section.group()
    )


def short(runs: list[Run]) -> list[str]:
    return [str(r.pk)[:8] for r in runs]


def test_it_needs_a_login_and_a_role(client_for):
    anonymous = client_for(None).get("/now/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")
    assert client_for("outsider").get("/now/").status_code == 403
    assert client_for("viewer").get("/now/").status_code == 200


def test_it_shows_each_state_with_its_runs_workers_and_waits(client_for):
    deciding = make_in_flight("deciding", 2, worker="w-a:1", waited=4)
    acting = make_in_flight("acting", 1, worker="w-b:2", waited=200, tools=("search", "notify"))
    backoff = make_in_flight("backoff", 1, wake_in=300)
    approval = make_in_flight("approval", 1, tools=("reserve",))
    in_doubt = make_in_flight("in_doubt", 1, tools=("ledger_write",))
    stalled = make_in_flight("stalled", 1, worker="w-c:3", waited=30)
    make_in_flight("queued", 3)

    response = client_for("viewer").get("/now/")
    html = response.content.decode()
    assert "<b>7</b> in flight" in html and "<b>3</b> queued" in html
    for title in ("Deciding", "On a tool", "In backoff", "Waiting for approval", "In doubt"):
        assert title in html
    assert "Stalled: lease expired" in html
    assert set(listed(html, "deciding")) == set(short(deciding))
    for state, runs in [
        ("acting", acting),
        ("backoff", backoff),
        ("approval", approval),
        ("in_doubt", in_doubt),
        ("stalled", stalled),
    ]:
        assert listed(html, state) == short(runs), state
    assert len(listed(html, "queued")) == 3
    assert "3 min" in html and re.search(r">3\d s<", html)  # acting 200 s, stalled 30 s
    assert "wakes in" in html and "ToolError: try later" in html
    assert '<span class="tool running">search</span> <span class="sub">running</span>' in html
    assert "awaiting approval" in html and "in doubt" in html


def test_the_matrix_counts_runs_per_worker_and_state(client_for):
    make_in_flight("deciding", 2, worker="w-a:1")
    make_in_flight("acting", 3, worker="w-a:1")
    make_in_flight("acting", 1, worker="w-b:2")
    make_in_flight("approval", 1)

    html = client_for("viewer").get("/now/").content.decode()
    matrix = re.search(r'<table class="grid matrix[^"]*">.*?</table>', html, re.S).group()
    rows = {
        m.group(1): re.findall(
            r'<td class="num[^"]*"[^>]*>(?:<a [^>]*>)?(\d+|<span class="zero">)', m.group(2)
        )
        for m in re.finditer(
            r'<th scope="row"[^>]*><a [^>]*>([^<]+)</a></th>(.*?)</tr>', matrix, re.S
        )
    }
    zero = '<span class="zero">'
    assert rows["w-a:1"] == ["2", "3", zero, zero, zero, zero, zero, zero, "5"]
    assert rows["w-b:2"] == [zero, "1", zero, zero, zero, zero, zero, zero, "1"]
    assert rows["nobody (parked or queued)"] == [zero, zero, zero, "1", zero, zero, zero, zero, "1"]
    assert 'href="?worker=w-a%3A1&amp;state=acting"' in matrix


def test_each_state_lists_its_longest_waits_first_and_says_how_many_more(client_for):
    runs = [make_in_flight("acting", waited=1000 - i)[0] for i in range(53)]
    client = client_for("viewer")

    html = client.get("/now/").content.decode()
    assert listed(html, "acting") == short(runs[:50])
    assert "and 3 more" in html
    assert 'href="?state=acting&amp;limit=500#state-acting"' in html
    everything = client.get("/now/?state=acting&limit=500").content.decode()
    assert listed(everything, "acting") == short(runs)
    assert "more" not in re.search(r'id="state-acting".*?</section>', everything, re.S).group()


def test_it_filters_by_worker_and_by_state_with_query_parameters(client_for):
    mine = make_in_flight("acting", 2, worker="w-b:2")
    make_in_flight("acting", 2, worker="w-a:1")
    make_in_flight("deciding", 1, worker="w-b:2")
    parked = make_in_flight("backoff", 1)
    client = client_for("viewer")

    html = client.get("/now/?worker=w-b:2&state=acting").content.decode()
    assert set(listed(html, "acting")) == set(short(mine))
    assert 'id="state-deciding"' not in html
    assert "showing on a tool, worker w-b:2" in html
    nobody = client.get("/now/?worker=none").content.decode()
    assert listed(nobody, "backoff") == short(parked) and listed(nobody, "acting") == []


def test_bad_filters_show_everything_and_say_why(client_for):
    runs = make_in_flight("acting", 2)
    response = client_for("viewer").get("/now/?state=sleeping&limit=0")
    html = response.content.decode()
    assert response.status_code == 200 and "(showing everything)" in html
    assert set(listed(html, "acting")) == set(short(runs))


def test_the_body_polls_every_2_s_and_its_fragment_comes_alone(client_for):
    make_in_flight("deciding", 1)
    client = client_for("viewer")
    page = client.get("/now/?state=deciding").content.decode()
    assert re.search(
        r'<div id="now-body" hx-get="/now/\?state=deciding" hx-trigger="every 2s"', page
    )

    fragment = client.get("/now/?state=deciding", **hx("now-body"))
    body = fragment.content.decode()
    assert fragment.status_code == 200
    assert body.lstrip().startswith('<div id="now-body"') and "<html" not in body
    assert len(listed(body, "deciding")) == 1
    assert 'id="now-body"' in client.get("/now/", **hx("now-body")).content.decode()


def test_untrusted_text_on_the_page_stays_text(client_for):
    [run] = make_in_flight("backoff", worker="w:1")
    ToolCall.objects.filter(run=run).update(error='<img src=x onerror="alert(1)">')
    Run.objects.filter(pk=run.pk).update(agent="<script>alert(2)</script>")
    html = client_for("viewer").get("/now/").content.decode()
    assert "<img src=x" not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert "<script>alert(2)" not in html and "&lt;script&gt;alert(2)" in html


def test_the_nav_links_to_the_now_page(client_for):
    html = client_for("viewer").get("/now/").content.decode()
    assert '<a href="/now/" aria-current="page">Now</a>' in html
    assert re.search(r'<a href="/"\s*>Runs</a>', html)  # not the current page here


def test_the_run_list_header_counts_what_is_in_flight_and_links_to_now(client_for):
    make_in_flight("deciding", 12)
    make_in_flight("acting", 30)
    make_in_flight("backoff", 4)
    make_in_flight("approval", 1)

    html = client_for("viewer").get("/").content.decode()
    header = re.search(r'<span id="inflight-counts".*?</a>\s*</span>', html, re.S).group()
    text = re.sub(r"<[^>]+>", "", header).split()
    assert " ".join(text) == "12 deciding · 30 on a tool · 4 backoff · 1 approval"
    assert '<a href="/now/"' in header and 'hx-trigger="every 2s"' in header


def test_the_run_list_header_counts_poll_until_nothing_is_in_flight(client_for):
    make_in_flight("acting", 2)
    client = client_for("viewer")
    live = client.get("/", **hx("inflight-counts"))
    assert live.status_code == 200 and "<b>2</b> on a tool" in live.content.decode()
    assert 'hx-get="/"' in live.content.decode()

    Run.objects.update(status="succeeded")
    done = client.get("/", **hx("inflight-counts"))
    assert done.status_code == 286  # htmx: stop polling
    assert "nothing in flight" in done.content.decode() and "hx-get" not in done.content.decode()
    assert "nothing in flight" in client.get("/").content.decode()


@pytest.mark.parametrize(
    "seconds, text",
    [(0.04, "0.0 s"), (1.23, "1.2 s"), (42.4, "42 s"), (185, "3 min"), (7380, "2 h 03 min")],
)
def test_waits_read_at_a_glance(seconds, text):
    assert waited(seconds) == text
    assert waited(-seconds) == text
    assert waited(3 * 86400 + 4 * 3600) == "3 d 4 h"
