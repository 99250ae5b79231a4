"""GET /api/runs/{id}/export streams the archive to any role; POST /api/runs/import is for
operators; the debugger's download is the same archive."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agentrun.models import ApiToken, Run
from tests.agentrun import archives
from tests.agentrun.test_archive_export_import import forget
from tests.base import PASSWORD, make_people

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


def api_client(user) -> Client:
    return Client(headers={"Authorization": f"Bearer {ApiToken.issue(user)}"})


def body(response) -> bytes:
    assert response.streaming  # streamed as the rows are read
    return b"".join(response.streaming_content)


def test_any_role_exports_a_run_as_a_streamed_gzip_attachment(people):
    run = archives.finished_run()
    response = api_client(people["viewer"]).get(f"/api/runs/{run.pk}/export")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/gzip"
    assert (
        response["Content-Disposition"] == f'attachment; filename="run-{run.pk}.agentrun.jsonl.gz"'
    )
    recs = archives.records(body(response))
    assert recs[0]["run"] == str(run.pk) and recs[0]["exported_by"] == "victor"


def test_ancestors_come_with_ancestors_1(people):
    parent = archives.finished_run()
    fork = archives.edited_fork(parent)
    client = api_client(people["viewer"])
    alone = archives.records(body(client.get(f"/api/runs/{fork.pk}/export")))
    both = archives.records(body(client.get(f"/api/runs/{fork.pk}/export?ancestors=1")))
    assert [r["id"] for r in alone[0]["runs"]] == [str(fork.pk)]
    assert [r["id"] for r in both[0]["runs"]] == [str(parent.pk), str(fork.pk)]


def test_exporting_needs_a_role_and_a_run(people):
    run = archives.finished_run()
    assert Client().get(f"/api/runs/{run.pk}/export").status_code == 401
    assert api_client(people["outsider"]).get(f"/api/runs/{run.pk}/export").status_code == 403
    missing = api_client(people["viewer"]).get(
        "/api/runs/00000000-0000-4000-8000-000000000000/export"
    )
    assert missing.status_code == 404


def test_an_operator_imports_and_gets_the_run_read_only(people):
    run = archives.finished_run()
    data = archives.export_bytes(run)
    forget(run)
    response = api_client(people["operator"]).post(
        "/api/runs/import", data=data, content_type="application/gzip"
    )
    assert response.status_code == 201, response.content
    got = response.json()
    assert got["run"]["id"] == str(run.pk) and got["run"]["imported_at"]
    assert got["runs"] == [str(run.pk)] and (got["steps"], got["snapshots"]) == (4, 8)
    assert response["Location"] == f"/api/runs/{run.pk}"
    assert Run.objects.get(pk=run.pk).imported["by"] == "olga"


@pytest.mark.parametrize("who, status", [("viewer", 403), ("outsider", 403), (None, 401)])
def test_only_an_operator_may_import(people, who, status):
    run = archives.finished_run()
    data = archives.export_bytes(run)
    forget(run)
    client = api_client(people[who]) if who else Client()
    before = archives.row_counts()
    response = client.post("/api/runs/import", data=data, content_type="application/gzip")
    assert response.status_code == status
    assert archives.row_counts() == before


def test_a_session_import_needs_the_csrf_token(people):
    run = archives.finished_run()
    data = archives.export_bytes(run)
    forget(run)
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="olga", password=PASSWORD)
    response = client.post("/api/runs/import", data=data, content_type="application/gzip")
    assert response.status_code == 403 and "CSRF" in response.json()["detail"]
    assert not Run.objects.filter(pk=run.pk).exists()


def test_the_run_page_download_is_the_archive(people):
    run = archives.finished_run()
    client = Client()
    assert client.login(username="victor", password=PASSWORD)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/runs/{run.pk}/export/"' in page
    response = client.get(f"/runs/{run.pk}/export/")
    assert response["Content-Type"] == "application/gzip"
    recs = archives.records(body(response))
    assert recs[0]["run"] == str(run.pk) and recs[-1]["type"] == "end"
    outsider = Client()
    assert outsider.login(username="oscar", password=PASSWORD)
    assert outsider.get(f"/runs/{run.pk}/export/").status_code == 403


CSRF = re.compile(r'"X-CSRFToken": "[^"]*"|name="csrfmiddlewaretoken" value="[^"]*"')


def pages_of(client, parent, fork) -> dict[str, str]:
    urls = [f"/runs/{fork.pk}/compare/"]
    for run in (parent, fork):
        for n in run.steps.values_list("number", flat=True):
            urls += [
                f"/runs/{run.pk}/steps/{n}/diff/",
                f"/runs/{run.pk}/steps/{n}/pre/",
                f"/runs/{run.pk}/steps/{n}/post.json",
            ]
    pages = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        # The CSRF token masked in the page differs on each one, whatever the run.
        pages[url] = CSRF.sub("", response.content.decode())
    return pages


def test_every_debugger_view_shows_an_imported_fork_as_at_its_source(people):
    parent = archives.finished_run()
    fork = archives.edited_fork(parent)
    client = Client()
    assert client.login(username="victor", password=PASSWORD)
    before = pages_of(client, parent, fork)
    assert "edited goal" in before[f"/runs/{fork.pk}/compare/"]
    data = archives.export_bytes(fork, ancestors=True)
    forget(parent, fork)
    archives.import_bytes(data)

    after = pages_of(client, parent, fork)

    assert after.keys() == before.keys()
    for url, page in before.items():
        assert after[url] == page, url
    timeline = client.get(f"/runs/{fork.pk}/").content.decode()
    assert "imported · read-only" in timeline and 'id="strip"' in timeline
