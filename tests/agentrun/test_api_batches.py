"""Replay batches through the JSON API: preview, create, progress, cancel, promote, and bad
input that answers 4xx and creates nothing; a viewer reads batches but can't act on them."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.lifecycle import batches
from agentrun.models import BatchItem, Event, ReplayBatch, Run
from tests.base import make_people
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db

FAILED = {"agent": "refunds", "status": "failed"}


@pytest.fixture
def people():
    return make_people()


def client_of(person):
    client = Client()
    client.force_login(person)
    return client


def post(client, path, body):
    return client.post(path, body, content_type="application/json")


def test_a_dry_run_previews_each_run_and_its_fork_point_and_creates_nothing(people, on_v1):
    incident(n_failing=2, n_fine=1)
    body = {"filter": {"agent": "refunds"}, "from": "before-failure", "name": "x", "dry_run": True}
    response = post(client_of(people["operator"]), "/api/batches", body)
    assert response.status_code == 200, response.content
    preview = response.json()
    assert (preview["count"], preview["skipped"], preview["from"]) == (2, 1, "before-failure")
    assert sorted((r["step"] or 0, r["skip_reason"]) for r in preview["runs"]) == [
        (0, "no failed step"),
        (2, ""),
        (2, ""),
    ]
    assert ReplayBatch.objects.count() == 0


def test_create_follow_and_promote_a_batch(people, on_v1, monkeypatch):
    incident(n_failing=2, n_fine=0)
    deploy_v2(monkeypatch)
    operator = client_of(people["operator"])
    body = {"filter": FAILED, "version": "v2", "name": "refunds fixed", "reason": "INC-7"}
    response = post(operator, "/api/batches", body)
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["count"] == 2 and created["status"] == "running"
    assert response["Location"] == f"/api/batches/{created['id']}"
    run_batch(ReplayBatch.objects.get(pk=created["id"]))
    got = operator.get(f"/api/batches/{created['id']}").json()
    assert got["status"] == "done" and got["counts"]["verdicts"]["fixed"] == 2
    assert {r["verdict"] for r in got["runs"]} == {"fixed"}
    assert all(
        Run.objects.get(pk=r["fork"]).parent_id.hex == r["parent"].replace("-", "")
        for r in got["runs"]
    )
    refused = post(operator, f"/api/batches/{created['id']}/promote", {})
    assert refused.status_code == 400 and refused.json()["field"] == "confirm_live"
    preview = post(operator, f"/api/batches/{created['id']}/promote", {"dry_run": True}).json()
    assert preview["count"] == 2 and preview["side_effects"] == {"ledger_write": 2}
    live = post(operator, f"/api/batches/{created['id']}/promote", {"confirm_live": True})
    assert live.status_code == 201 and live.json()["mode"] == "live"
    assert live.json()["promoted_from"] == created["id"]
    listed = operator.get("/api/batches").json()
    assert listed["count"] == 2 and [b["name"] for b in listed["items"]] == [
        "refunds fixed (live)",
        "refunds fixed",
    ]


def test_cancel_stops_new_forks(people, on_v1):
    incident(n_failing=3, n_fine=0)
    operator = client_of(people["operator"])
    created = post(operator, "/api/batches", {"filter": FAILED, "name": "x", "max_in_flight": 1})
    batch_id = created.json()["id"]
    batches.advance(batch_id)
    response = post(operator, f"/api/batches/{batch_id}/cancel", {"reason": "wrong fix"})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert response.json()["counts"]["runs"]["skipped"] == 2
    again = post(operator, f"/api/batches/{batch_id}/cancel", {})
    assert again.status_code == 409


def test_a_viewer_sees_batches_but_cant_start_cancel_or_promote_one(people, on_v1):
    incident(n_failing=1, n_fine=0)
    batch = batches.create(FAILED, name="seen")
    viewer = client_of(people["viewer"])
    assert viewer.get(f"/api/batches/{batch.pk}").status_code == 200
    assert viewer.get("/api/batches").json()["count"] == 1
    assert post(viewer, "/api/batches", {"filter": FAILED, "name": "y"}).status_code == 403
    assert post(viewer, f"/api/batches/{batch.pk}/cancel", {}).status_code == 403
    assert post(viewer, f"/api/batches/{batch.pk}/promote", {}).status_code == 403
    assert ReplayBatch.objects.count() == 1


@pytest.mark.parametrize(
    "change, field",
    [
        ({"filter": {"colour": "red"}}, "filter"),
        ({"version": ""}, "version"),
        ({"version": "v" * 65}, "version"),
        ({"from": "the middle"}, "from"),
        ({"from": {"step": "two"}}, "from"),
        ({"filter": {"agent": "nobody"}}, "filter"),
        ({"name": ""}, "name"),
        ({"mode": "live"}, "confirm_live"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_input_answers_400_naming_the_member_and_creates_nothing(people, on_v1, change, field):
    incident(n_failing=1, n_fine=0)
    body = {"filter": FAILED, "name": "x", **change}
    response = post(client_of(people["operator"]), "/api/batches", body)
    assert response.status_code == 400, response.content
    assert response.json().get("field", "") in (field, f"body.{field}", "")
    assert field in response.json()["detail"] + response.json().get("field", "")
    assert ReplayBatch.objects.count() == 0 and BatchItem.objects.count() == 0
    assert not Event.objects.filter(kind="batch_created").exists()


def test_an_unknown_batch_is_a_404(people):
    response = client_of(people["viewer"]).get("/api/batches/00000000-0000-4000-8000-000000000001")
    assert response.status_code == 404
