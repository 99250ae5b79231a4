"""Pins and retention through the API: POST /api/runs/{id}/pin and /unpin, ?pinned=,
when a run will be purged, and what a purged run still answers."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentrun.lifecycle import retention, services
from agentrun.models import ApiToken, Event, Run
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

READS = script(calls({"tool": "echo", "args": {"n": 1}}), final())
SIDE_EFFECT = script(
    calls({"tool": "ledger_write", "args": {"account": "a", "amount": 2}}), final()
)


@pytest.fixture
def people():
    return make_people()


def bearer(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(user)}")


def post(client, url, body=None, raw=None):
    data = raw if raw is not None else (body if body is not None else {})
    return client.post(url, data, content_type="application/json")


@pytest.fixture
def run():
    return drive(make_run(READS))


def test_an_operator_pins_a_run_with_a_reason_and_unpins_it(people, run, settings):
    settings.AGENTRUN_RETENTION_DAYS = 30
    olga = bearer(people["operator"])
    response = post(olga, f"/api/runs/{run.pk}/pin", {"reason": "incident #123"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["pin"]["reason"] == "incident #123" and body["pin"]["by"] == "olga"
    assert body["purge_after"] is None and body["purged_at"] is None
    listed = olga.get("/api/runs?pinned=true").json()
    assert [r["id"] for r in listed["items"]] == [str(run.pk)] and listed["count"] == 1
    assert olga.get("/api/runs?pinned=false").json()["count"] == 0

    response = post(olga, f"/api/runs/{run.pk}/unpin", {"reason": "closed"})
    assert response.status_code == 200
    body = response.json()
    assert body["pin"] is None
    run.refresh_from_db()
    due = run.finished_at + timedelta(days=30)
    assert abs(datetime.fromisoformat(body["purge_after"]) - due) < timedelta(milliseconds=1)
    events = Event.objects.filter(run=run, kind__in=("run_pinned", "run_unpinned"))
    assert [(e.kind, e.actor, e.reason) for e in events.order_by("id")] == [
        ("run_pinned", "olga", "incident #123"),
        ("run_unpinned", "olga", "closed"),
    ]


@pytest.mark.parametrize(
    "raw",
    [
        "{}",
        '{"reason": ""}',
        '{"reason": "   "}',
        '{"reason": "\\t\\n"}',
        '{"reason": 123}',
        '{"reason": "x", "extra": 1}',
        '{"reason": "' + "x" * 2001 + '"}',
        '{"reason": "a\\u0000b"}',
        "[]",
        "not json",
    ],
)
def test_a_pin_without_a_proper_reason_is_a_400_and_changes_nothing(people, run, raw):
    response = post(bearer(people["operator"]), f"/api/runs/{run.pk}/pin", raw=raw)
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    run.refresh_from_db()
    assert run.pinned_at is None
    assert not Event.objects.filter(kind="run_pinned").exists()


def test_a_viewer_may_not_pin_or_unpin(people, run):
    services.pin_run(run, user=people["admin"], reason="incident")
    victor = bearer(people["viewer"])
    for action in ("pin", "unpin"):
        response = post(victor, f"/api/runs/{run.pk}/{action}", {"reason": "mine"})
        assert response.status_code == 403
        assert "operator role" in response.json()["detail"]
    run.refresh_from_db()
    assert run.pin_reason == "incident"


def test_pin_answers_404_for_no_such_run_and_409_when_it_does_not_apply(people, run):
    olga = bearer(people["operator"])
    assert post(olga, f"/api/runs/{uuid.uuid4()}/pin", {"reason": "x"}).status_code == 404
    response = post(olga, f"/api/runs/{run.pk}/unpin")
    assert response.status_code == 409 and "not pinned" in response.json()["detail"]
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=40))
    retention.purge(timedelta(days=30))
    response = post(olga, f"/api/runs/{run.pk}/pin", {"reason": "too late"})
    assert response.status_code == 409 and "purged" in response.json()["detail"]


def test_a_purged_run_still_answers_with_its_side_effects_and_refuses_its_snapshots(people):
    run = drive(make_run(SIDE_EFFECT))
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=40))
    retention.purge(timedelta(days=30))
    client = bearer(people["viewer"])
    body = client.get(f"/api/runs/{run.pk}").json()
    assert body["purged_at"] and body["purge_after"] is None and body["status"] == "succeeded"
    assert [s["number"] for s in body["steps"]] == [1]
    [call] = body["steps"][0]["tool_calls"]
    assert call["tool"] == "ledger_write" and call["idempotency_key"].startswith(str(run.pk))
    response = client.get(f"/api/runs/{run.pk}/snapshots/1/pre")
    assert response.status_code == 404 and "purged" in response.json()["detail"]
    response = post(bearer(people["operator"]), f"/api/runs/{run.pk}/fork", {"step": 1})
    assert response.status_code == 400 and "purged" in response.json()["detail"]


def test_a_run_kept_by_a_pinned_fork_says_so(people, run):
    fork = drive(services.fork_run(run, step=1, at="post", user=people["operator"]))
    services.pin_run(fork, user=people["operator"], reason="incident #7")
    body = bearer(people["viewer"]).get(f"/api/runs/{run.pk}").json()
    assert body["kept_by"] == str(fork.pk)
    assert bearer(people["viewer"]).get(f"/api/runs/{fork.pk}").json()["kept_by"] is None
