"""A batch's progress page: counts by state and by verdict that poll while it runs and stop
when it is done, each run's verdict a link to its fork against its parent, a verdict's row
a list of its runs, the skipped runs with why."""

from __future__ import annotations

import re

import pytest

from agentrun.lifecycle import batches
from agentrun.models import Run
from tests.debugger.conftest import hx
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch(on_v1, monkeypatch, people):
    """The refunds incident's five runs in a sandbox batch onto v2 (the fix): three forks
    to make, two runs skipped (nothing failed in them). Not advanced yet."""
    incident()
    deploy_v2(monkeypatch)
    return batches.create(
        {"agent": "refunds"},
        mode="sandbox",
        version="v2",
        name="refunds INC-7",
        user=people["operator"],
    )


def count(html: str, key: str) -> int:
    return int(re.search(rf'id="count-{key}"><b class="n">(\d+)</b>', html).group(1))


def verdict_count(html: str, verdict: str) -> int:
    row = re.search(rf'id="verdict-{verdict}".*?class="num count">(\d+)<', html, re.S)
    return int(row.group(1))


def test_it_counts_the_runs_by_state_and_polls_while_the_batch_runs(client_for, batch):
    client = client_for("viewer")
    html = client.get(f"/batches/{batch.pk}/").content.decode()
    assert 'hx-trigger="every 2s"' in html and "live</span>" in html
    assert (count(html, "total"), count(html, "pending"), count(html, "skipped")) == (5, 3, 2)
    assert count(html, "created") == 0

    batches.advance(batch.pk)  # the forks are made: three running
    live = client.get(f"/batches/{batch.pk}/", **hx("batch-live"))
    assert live.status_code == 200
    body = live.content.decode()
    assert body.lstrip().startswith('<div id="batch-live"') and "<html" not in body
    assert (count(body, "created"), count(body, "running"), count(body, "pending")) == (3, 3, 0)

    token = re.search(r"v=([0-9a-f]+)", body).group(1)
    unchanged = client.get(f"/batches/{batch.pk}/?v={token}", **hx("batch-live"))
    assert unchanged.status_code == 204  # nothing moved: nothing to redraw


def test_polling_stops_with_the_final_counts_once_every_fork_has_ended(client_for, batch):
    run_batch(batch)
    client = client_for("viewer")
    live = client.get(f"/batches/{batch.pk}/", **hx("batch-live"))
    assert live.status_code == 286  # htmx: swap this in, and stop polling
    body = live.content.decode()
    assert "hx-trigger" not in body
    assert (count(body, "succeeded"), verdict_count(body, "fixed")) == (3, 3)
    assert verdict_count(body, "still_failing") == 0
    assert 'id="batch-status">done<' in body
    assert 'hx-trigger="every 2s"' not in client.get(f"/batches/{batch.pk}/").content.decode()


def test_each_runs_verdict_opens_its_fork_against_its_parent(client_for, batch):
    run_batch(batch)
    html = client_for("viewer").get(f"/batches/{batch.pk}/").content.decode()
    forks = Run.objects.filter(batch=batch)
    assert forks.count() == 3
    for fork in forks:
        assert f'<a class="vd vd-fixed verdict-link" href="/runs/{fork.pk}/compare/"' in html
        assert f'href="/runs/{fork.parent_id}/"' in html
    compare = client_for("viewer").get(f"/runs/{forks[0].pk}/compare/")
    assert compare.context["other"].pk == forks[0].parent_id


def test_a_verdicts_row_lists_the_runs_that_have_it(client_for, batch):
    run_batch(batch)
    client = client_for("viewer")
    html = client.get(f"/batches/{batch.pk}/").content.decode()
    assert 'href="?verdict=fixed#batch-runs" data-verdict="fixed"' in html
    fixed = client.get(f"/batches/{batch.pk}/?verdict=fixed")
    assert fixed.context["shown"] == "fixed"
    assert {i.verdict for i in fixed.context["page"]} == {"fixed"}
    assert len(fixed.context["page"]) == 3
    assert 'id="verdict-fixed" class="sel"' in fixed.content.decode()
    none = client.get(f"/batches/{batch.pk}/?verdict=still_failing")
    assert len(none.context["page"]) == 0 and b"No run with this verdict." in none.content
    everything = client.get(f"/batches/{batch.pk}/?verdict=bogus")
    assert everything.context["shown"] == "" and len(everything.context["page"]) == 5


def test_skipped_runs_are_listed_with_why(client_for, batch):
    client = client_for("viewer")
    html = client.get(f"/batches/{batch.pk}/").content.decode()
    assert "<li><b>2</b> <span hx-disable>no failed step</span></li>" in html
    skipped = client.get(f"/batches/{batch.pk}/?verdict=skipped")
    assert [i.status for i in skipped.context["page"]] == ["skipped", "skipped"]
    assert skipped.content.decode().count("skipped: no failed step") == 2


def test_operators_see_cancel_and_promote_and_viewers_see_neither(client_for, batch):
    url = f"/batches/{batch.pk}/"
    running = client_for("operator").get(url).content.decode()
    assert 'data-action="cancel-batch"' in running and 'data-action="promote"' not in running
    assert 'data-action="cancel-batch"' not in client_for("viewer").get(url).content.decode()
    run_batch(batch)
    done = client_for("operator").get(url).content.decode()
    assert 'data-action="promote"' in done and 'data-action="cancel-batch"' not in done
    assert 'data-action="promote"' not in client_for("viewer").get(url).content.decode()


def test_an_unknown_batch_is_not_found_and_an_outsider_is_refused(client_for, batch):
    unknown = "/batches/00000000-0000-0000-0000-000000000000/"
    assert client_for("viewer").get(unknown).status_code == 404
    assert client_for("outsider").get(f"/batches/{batch.pk}/").status_code == 403
