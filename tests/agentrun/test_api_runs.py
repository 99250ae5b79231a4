"""Starting runs and reading them back: list, detail, snapshots, ledger, OpenAPI."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, get_resolver
from django.utils import timezone

from agentrun.api import urls as api_urls
from agentrun.lifecycle import selection
from agentrun.models import Event, Run
from agentrun.store import snapshots
from agentrun.store.delta import state_hash
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["operator"])
    return client


PAYING = script(
    calls({"tool": "echo", "args": {"q": "price"}}, thought="look it up"),
    calls({"tool": "ledger_write", "args": {"account": "acme", "amount": 12.5}}, thought="pay"),
    final("paid 12.5"),
)


def start(client, input=PAYING, agent="scripted"):
    response = client.post(
        "/api/runs", {"agent": agent, "input": input}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_starting_a_run_returns_201_with_the_queued_run(client):
    body = start(client)

    assert body["status"] == "queued"
    assert body["agent"] == "scripted"
    assert body["created_by"] == "olga"
    assert body["created_at"]
    run = Run.objects.get(pk=body["id"])
    assert run.input == PAYING
    assert Event.objects.filter(run=run, kind="run_created", actor="olga").exists()


def test_a_driven_run_shows_its_steps_and_tool_calls_with_idempotency_keys(client):
    run_id = start(client)["id"]
    drive(Run.objects.get(pk=run_id))

    body = client.get(f"/api/runs/{run_id}").json()

    assert body["status"] == "succeeded"
    assert body["final_answer"] == "paid 12.5"
    assert body["phase"] == "done"
    assert body["started_at"] and body["finished_at"]
    assert body["next_step"] == 4
    assert [s["number"] for s in body["steps"]] == [1, 2, 3]
    first, second, last = body["steps"]
    assert first["thought"] == "look it up"
    assert first["status"] == "succeeded"
    assert first["decision_count"] == 1
    assert first["phase_before"] == "idle"
    assert last["tool_calls"] == []
    (echo,) = first["tool_calls"]
    assert echo["tool"] == "echo" and echo["kind"] == "read" and echo["status"] == "ok"
    assert echo["args"] == {"q": "price"}
    assert echo["result"] == {"q": "price"}
    assert echo["idempotency_key"].startswith(f"{run_id}:1:0:echo:")
    (write,) = second["tool_calls"]
    assert write["kind"] == "write"
    assert re.fullmatch(rf"{run_id}:2:0:ledger_write:[0-9a-f]{{16}}", write["idempotency_key"])
    assert len(write["attempts"]) == 1
    assert write["attempts"][0]["error"] is None
    assert write["approval"] is None and write["compensation"] is None


def test_a_failed_step_shows_its_failure(client):
    run_id = start(client, script(calls({"tool": "fail", "args": {"message": "boom"}})))["id"]
    drive(Run.objects.get(pk=run_id))

    body = client.get(f"/api/runs/{run_id}").json()

    assert body["status"] == "failed"
    assert "boom" in body["error"]
    (step,) = body["steps"]
    assert step["failure"]["message"] == "boom"
    assert step["failure"]["tool"] == "fail"
    assert step["tool_calls"][0]["status"] == "failed"


def test_the_snapshot_endpoint_returns_the_exact_stored_state(client):
    run_id = start(client)["id"]
    drive(Run.objects.get(pk=run_id))

    for step in (1, 2, 3):
        for at in ("pre", "post"):
            body = client.get(f"/api/runs/{run_id}/snapshots/{step}/{at}").json()
            stored = snapshots.get(run_id, step, at)
            assert body["step"] == step and body["at"] == at
            assert body["state"] == snapshots.load_state(stored)
            assert body["hash"] == stored.hash == state_hash(body["state"])
    assert body["state"]["final_answer"] == "paid 12.5"


@pytest.mark.parametrize("tail", ["9/pre", "1/middle", "x/pre", "-1/pre", "²/pre", "1/PRE"])
def test_a_missing_or_malformed_snapshot_is_a_json_404(client, tail):
    run_id = start(client)["id"]
    drive(Run.objects.get(pk=run_id))

    response = client.get(f"/api/runs/{run_id}/snapshots/{tail}")

    assert response.status_code == 404
    assert response.json()["detail"]


def test_the_ledger_endpoint_lists_entries_and_invocations(client):
    run_id = start(client)["id"]
    drive(Run.objects.get(pk=run_id))
    key = client.get(f"/api/runs/{run_id}").json()["steps"][1]["tool_calls"][0]["idempotency_key"]

    body = client.get(f"/api/ledger?run={run_id}").json()

    assert body["invocations"] == {key: 1}
    (entry,) = body["entries"]
    assert entry["idempotency_key"] == key
    assert entry["account"] == "acme"
    assert float(entry["amount"]) == 12.5
    assert entry["created_at"]


def test_the_ledger_of_a_run_without_writes_is_empty(client):
    run = drive(make_run())
    assert client.get(f"/api/ledger?run={run.pk}").json() == {"entries": [], "invocations": {}}


def test_the_run_list_is_newest_first_with_a_total_count(client):
    ids = [start(client)["id"] for _ in range(3)]

    body = client.get("/api/runs").json()

    assert body["count"] == 3
    assert [item["id"] for item in body["items"]] == ids[::-1]
    assert "steps" not in body["items"][0]


def test_the_run_list_pages_with_limit_and_offset(client):
    ids = [start(client)["id"] for _ in range(5)][::-1]

    page = client.get("/api/runs?limit=2&offset=2").json()

    assert page["count"] == 5
    assert [item["id"] for item in page["items"]] == ids[2:4]
    assert client.get("/api/runs?offset=5").json() == {"items": [], "count": 5}


def test_the_run_list_filters_by_status_and_agent(client):
    done = drive(Run.objects.get(pk=start(client)["id"]))
    queued = start(client)["id"]

    succeeded = client.get("/api/runs?status=succeeded").json()
    assert [item["id"] for item in succeeded["items"]] == [str(done.pk)]
    assert succeeded["count"] == 1
    assert [i["id"] for i in client.get("/api/runs?status=queued").json()["items"]] == [queued]
    assert client.get("/api/runs?agent=scripted").json()["count"] == 2
    assert client.get("/api/runs?agent=nobody").json() == {"items": [], "count": 0}


def test_the_run_list_takes_the_triage_views(client):
    def failing(message):
        return drive(
            make_run(script(calls({"tool": "fail", "args": {"message": message}}), final()))
        )

    declined = {str(failing("card declined").pk) for _ in range(3)}
    failing("out of stock")
    stuck, waiting = make_run(), make_run()
    Run.objects.filter(pk=stuck.pk).update(
        updated_at=timezone.now() - timedelta(hours=2),
        status="running",
        lease_owner="w1:1",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )

    def listed(query):
        answer = client.get(f"/api/runs?{query}")
        assert answer.status_code == 200, answer.content
        return {item["id"] for item in answer.json()["items"]}

    # The same definitions as the run list's views (agentrun.lifecycle.selection).
    assert listed("repeated=24") == declined
    assert listed("stuck=60") == {str(stuck.pk)}
    assert listed("no_worker=true") == {str(waiting.pk)}
    assert listed("no_worker=true&stuck=60") == set()
    for bad in (
        "stuck=0",
        "repeated=ten",
        f"repeated={selection.MAX_HOURS + 1}",
        "no_worker=maybe",
    ):
        answer = client.get(f"/api/runs?{bad}")
        assert answer.status_code == 400, bad
        assert answer.json()["field"] == bad.split("=")[0]


def test_an_unknown_run_is_a_json_404(client):
    response = client.get(f"/api/runs/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"


def test_the_openapi_document_describes_every_api_route():
    doc = Client().get("/api/openapi.json").json()

    assert doc["openapi"].startswith("3.1")
    documented = set(doc["paths"])
    routes = {
        "/api/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(p.pattern))
        for p in api_urls.urlpatterns
        if isinstance(p, URLPattern)
    }
    assert routes == documented
    assert {"bearerAuth", "sessionAuth"} <= set(doc["components"]["securitySchemes"])


def test_every_documented_path_resolves_to_an_api_view():
    doc = Client().get("/api/openapi.json").json()
    for path in doc["paths"]:
        concrete = re.sub(r"\{\w+\}", "x", path)
        assert get_resolver().resolve(concrete).url_name, path


def test_every_documented_schema_reference_exists():
    doc = Client().get("/api/openapi.json").json()
    refs = set(re.findall(r"#/components/schemas/(\w+)", str(doc)))
    assert refs <= set(doc["components"]["schemas"])


def test_the_openapi_document_lists_every_tool_call_status():
    from agentrun.api.openapi import document
    from agentrun.models import ToolCallStatus

    schema = document()["components"]["schemas"]["ToolCall"]["properties"]["status"]
    assert set(schema["enum"]) == set(ToolCallStatus.values)


@pytest.mark.parametrize(
    "since, answer",
    [
        # Valid ISO 8601 offsets beyond PostgreSQL's ±15:59, read in UTC.
        ("2026-01-01T00:00:00-16:38", 200),
        ("3639-03-16T18:48:47.6-16:38", 200),
        ("2026-01-01T00:00:00+23:59", 200),
        # A time that is no date once in UTC: a named error, no query.
        ("9999-12-31T23:59:59-23:59", 400),
        ("0001-01-01T00:00:00+23:59", 400),
    ],
)
def test_the_run_list_reads_any_offset_a_time_may_carry(client, since, answer):
    make_run(script(final("x")))
    response = client.get("/api/runs", {"since": since})
    assert response.status_code == answer, response.content
    if answer == 400:
        assert "since" in response.json()["detail"]
    else:
        assert response.json()["count"] == (1 if since.startswith("2026") else 0)
