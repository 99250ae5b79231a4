"""The batch list: every replay batch, newest first, with its status, mode, version, counts
and who made it when; "Batches" in the site's navigation."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import batches
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db


def test_it_lists_each_batch_with_its_status_mode_version_counts_and_maker(
    client_for, people, on_v1, monkeypatch
):
    incident()
    deploy_v2(monkeypatch)
    done = run_batch(
        batches.create(
            {"agent": "refunds", "status": "failed"},
            mode="sandbox",
            version="v2",
            name="refunds on v2",
            user=people["operator"],
        )
    )
    running = batches.create(
        {"agent": "refunds"}, "start", mode="recorded", name="all refunds", user=people["admin"]
    )
    response = client_for("viewer").get("/batches/")
    assert response.status_code == 200
    assert [row["batch"].pk for row in response.context["rows"]] == [running.pk, done.pk]
    html = response.content.decode()
    assert f'<a href="/batches/{done.pk}/">refunds on v2</a>' in html
    assert '<span class="badge bs-done">done</span>' in html
    assert '<span class="badge bs-running">running</span>' in html
    assert '<span class="mode-badge mode-recorded">recorded</span>' in html
    assert 'title="v2">v2</span>' in html
    assert '<span class="vd vd-fixed">3 fixed</span>' in html
    # all refunds: the incident's five runs and the first batch's three forks
    assert '<b>8</b> · <span class="c-pending">8 to fork</span>' in html
    assert "by olga" in html and "by ada" in html


def test_the_navigation_leads_to_it_and_marks_it_on_batch_pages(client_for, people):
    html = client_for("viewer").get("/batches/").content.decode()
    assert '<a href="/batches/" aria-current="page">Batches</a>' in html
    assert "No batches yet." in html
    runs_page = client_for("viewer").get("/").content.decode()
    assert '<a href="/batches/" >Batches</a>' in runs_page
