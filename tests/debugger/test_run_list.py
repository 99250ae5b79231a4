"""The run list: filters, search, pagination, and live rows that stop polling."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.models import Run
from tests.base import calls, final, make_run, script
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(people):
    olga = people["operator"]
    done = runs.walkthrough_run(olga)
    failed = runs.failing_run(olga)
    queued = runs.queued_run(olga)
    return done, failed, queued


def ids(response) -> set[str]:
    return {str(run.pk) for run in response.context["page"]}


def test_it_lists_runs_newest_first_with_status_agent_steps_and_phase(client_for, three):
    done, failed, queued = three
    response = client_for("viewer").get("/")
    assert [r.pk for r in response.context["page"]] == [queued.pk, failed.pk, done.pk]
    html = response.content.decode()
    assert (
        str(done.pk)[:8] in html and "succeeded" in html and "failed" in html and "queued" in html
    )
    assert "Refund order 1042" in html
    assert 'class="phase ph-done"' in html


def test_it_filters_by_status_agent_and_active(client_for, three):
    done, failed, queued = three
    client = client_for("viewer")
    assert ids(client.get("/?status=failed")) == {str(failed.pk)}
    assert ids(client.get("/?status=active")) == {str(queued.pk)}
    assert ids(client.get("/?agent=scripted")) == {str(r.pk) for r in three}
    assert client.get("/?status=bogus").context["page"].paginator.count == 0


def test_it_filters_by_date_range(client_for, three):
    done, failed, queued = three
    Run.objects.filter(pk=done.pk).update(created_at=timezone.now() - timedelta(days=10))
    client = client_for("viewer")
    since = (timezone.now() - timedelta(days=2)).date().isoformat()
    until = (timezone.now() - timedelta(days=5)).date().isoformat()
    assert ids(client.get(f"/?since={since}")) == {str(failed.pk), str(queued.pk)}
    assert ids(client.get(f"/?until={until}")) == {str(done.pk)}


def test_it_searches_goal_and_input_text_and_run_ids(client_for, three):
    done, failed, queued = three
    client = client_for("viewer")
    assert ids(client.get("/?q=refund order")) == {str(done.pk)}
    assert ids(client.get("/?q=GADGET-1")) == {str(failed.pk)}  # inside the input's steps
    assert ids(client.get(f"/?q={done.pk}")) == {str(done.pk)}
    assert ids(client.get(f"/?q={str(failed.pk)[:8]}")) == {str(failed.pk)}
    assert ids(client.get("/?q=nothing like this")) == set()


def test_it_paginates(client_for, people):
    for i in range(55):
        make_run(script(calls({"tool": "echo", "args": {"i": i}}), final(), goal=f"job {i}"))
    client = client_for("viewer")
    first = client.get("/")
    assert len(first.context["page"]) == 50 and first.context["page"].has_next()
    assert b'rel="next"' in first.content
    second = client.get("/?page=2")
    assert len(second.context["page"]) == 5
    assert not ids(first) & ids(second)


def test_it_marks_forks_with_a_link_to_the_parent(client_for, people):
    parent = runs.walkthrough_run(people["operator"])
    child = runs.queued_run(people["operator"])
    Run.objects.filter(pk=child.pk).update(parent=parent, mode="sandbox")
    html = client_for("viewer").get("/").content.decode()
    assert (
        f'href="/runs/{parent.pk}/" title="Forked from run {parent.pk}">fork of {str(parent.pk)[:8]}'
        in html
    )


def test_htmx_polls_get_only_the_rows_and_nothing_when_unchanged(client_for, three):
    client = client_for("viewer")
    page = client.get("/")
    assert page.context["active"]
    html = page.content.decode()
    assert 'hx-trigger="every 2s"' in html
    rows = client.get("/", **hx("run-rows"))
    assert rows.status_code == 200
    body = rows.content.decode()
    assert body.lstrip().startswith('<tbody id="run-rows"') and "<html" not in body
    token = re.search(r"v=([0-9a-f]+)", body).group(1)
    assert client.get(f"/?v={token}", **hx("run-rows")).status_code == 204


def test_polling_stops_when_nothing_on_the_page_is_active(client_for, people):
    runs.walkthrough_run(people["operator"])
    client = client_for("viewer")
    html = client.get("/").content.decode()
    assert 'hx-trigger="every 2s"' not in html
    rows = client.get("/", **hx("run-rows"))
    assert rows.status_code == 286  # htmx: stop polling (and swap in the final rows)
    assert b"hx-trigger" not in rows.content
