"""The run list: label chips and the label filter, the error column, and statuses told
apart at a glance (cancelled, failed, succeeded after retries), in a constant number of
queries."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentrun.lifecycle import services
from agentrun.models import Run, Step
from tests.base import calls, drive, final, script
from tests.debugger import runs

pytestmark = pytest.mark.django_db

ECHO = script(calls({"tool": "echo", "args": {"x": 1}}), final("done"), goal="echo once")


def start(labels=None, input=ECHO, user=None, go=True):
    run = services.start_run("scripted", input, labels=labels, user=user)
    return drive(run, through_backoff=True) if go else run


def ids(response) -> list[str]:
    return [str(run.pk) for run in response.context["page"]]


def test_each_row_shows_its_labels_as_chips_that_filter_the_list(client_for, people):
    stale = start({"story": "stale-cart", "team": "shop"})
    start({"story": "happy-path"})
    client = client_for("viewer")

    html = client.get("/").content.decode()

    assert 'href="/?label=story%3Dstale-cart"' in html
    assert ">story=stale-cart</a>" in html and ">team=shop</a>" in html
    filtered = client.get("/?label=story%3Dstale-cart")
    assert ids(filtered) == [str(stale.pk)]
    # A chip clicked on a filtered list adds its label to the filters already there.
    assert 'href="/?label=story%3Dstale-cart&amp;label=team%3Dshop"' in filtered.content.decode()


def test_the_label_filter_deep_links_combines_and_can_be_removed(client_for, people):
    stale = start({"story": "stale-cart", "team": "shop"})
    happy = start({"story": "happy-path", "team": "shop"})
    start()
    client = client_for("viewer")

    assert ids(client.get("/?label=story=stale-cart")) == [str(stale.pk)]
    assert set(ids(client.get("/?label=team=shop"))) == {str(stale.pk), str(happy.pk)}
    assert set(ids(client.get("/?label=story"))) == {str(stale.pk), str(happy.pk)}
    both = client.get("/?label=team=shop&label=story=happy-path&status=succeeded")
    assert ids(both) == [str(happy.pk)]
    html = both.content.decode()
    # The active filters, each with a link that drops it and keeps the rest.
    assert re.search(r'class="lchip active">.*team=shop.*story=happy-path', html, re.S)
    assert 'href="/?label=team%3Dshop&amp;status=succeeded"' in html
    # The form keeps them when another filter is applied.
    assert '<input type="hidden" name="label" value="team=shop">' in html
    # A blank label field (the form's own input) is no filter.
    assert len(ids(client.get("/?label=&label=team=shop"))) == 2


def test_a_bad_label_filter_says_why_and_lists_nothing(client_for, people):
    start({"story": "x"})
    response = client_for("viewer").get("/?label=bad key")
    assert response.status_code == 200
    assert ids(response) == []
    assert "label key &#x27;bad key&#x27; is not allowed" in response.content.decode()


def test_the_error_column_shows_the_error_shortened_on_one_line_and_escaped(client_for, people):
    failed = runs.failing_run(people["operator"])
    hostile = runs.failing_run(people["operator"])
    error = "<script>alert(1)</script> the tool sent \u241bu0000 here\nsecond line " + "x" * 300
    Run.objects.filter(pk=hostile.pk).update(error=error)

    html = client_for("viewer").get("/").content.decode()

    assert "warehouse API returned 503" in html
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; the tool sent" in html
    assert '<mark class="esc"' in html  # the storable escape is highlighted
    row = re.search(rf"{str(hostile.pk)[:8]}.*?</tr>", html, re.S).group(0)
    cell = re.search(r'<td class="err[^"]*"[^>]*>(.*?)</td>', row, re.S).group(1)
    assert "here second line" in cell  # one line
    assert "x" * 150 not in cell.split('title="')[0] and "…" in cell
    assert failed.error  # the other failed run shows its own


def test_statuses_are_told_apart_cancelled_failed_succeeded_and_after_retries(client_for, people):
    plain = start(input=goal_input("plain"))
    retried = start(
        input=script(
            calls({"tool": "flaky", "args": {"failures": 1}}), final("ok"), goal="flaky once"
        )
    )
    crashed = start(input=goal_input("crashed"))
    Step.objects.filter(run=crashed, number=1).update(crashes=1)  # as a claim records a crash
    approved = runs.waiting_run(people["operator"])
    services.decide_approval(approved, user=people["operator"], decision="approve")
    approved = drive(approved)
    failed = runs.failing_run(people["operator"])
    cancelled = runs.queued_run(people["operator"])
    services.cancel_run(cancelled, user=people["operator"])

    html = client_for("viewer").get("/").content.decode()

    def status(run):
        row = re.search(rf"{str(run.pk)[:8]}.*?</tr>", html, re.S)
        assert row, run
        start = html.rfind("<tr", 0, row.start())
        return re.search(r'<td class="status"[^>]*>(.*?)</td>', html[start:], re.S).group(1)

    assert retried.status == "succeeded" and approved.status == "succeeded"
    assert "succeeded · retried" in status(retried) and "backed off" in status(retried)
    assert "succeeded · retried" in status(crashed) and "crashed" in status(crashed)
    # An approval resumes its step; that is no retry (and no crash).
    assert ">succeeded<" in status(approved) and "retried" not in status(approved)
    assert not Step.objects.filter(run=approved, crashes__gt=0).exists()
    assert ">succeeded<" in status(plain)
    assert 'class="badge st-failed">failed<' in status(failed)
    assert 'class="badge st-cancelled">cancelled<' in status(cancelled)


def goal_input(goal):
    return script(calls({"tool": "echo", "args": {"x": goal}}), final("done"), goal=goal)


def test_the_list_takes_the_same_queries_for_5_runs_or_25(client_for, people):
    client = client_for("viewer")

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/?label=team=shop").status_code == 200
        return len(captured)

    for i in range(5):
        start({"team": "shop", "n": str(i)}, input=goal_input(f"job {i}"))
    few = queries()
    for i in range(20):
        start({"team": "shop", "n": str(i + 5)}, input=goal_input(f"job {i + 5}"))
    assert queries() == few
    assert len(ids(client.get("/?label=team=shop"))) == 25


def test_the_goal_is_read_without_loading_the_input(client_for, people):
    start(input=goal_input("Restock the tents"))
    response = client_for("viewer").get("/")
    assert "Restock the tents" in response.content.decode()
    [run] = response.context["page"]
    # Still deferred after the page was rendered: no row loaded it (one query per row).
    assert "input" in run.get_deferred_fields()
