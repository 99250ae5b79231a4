"""Who may call the JSON API: sessions, Bearer tokens, roles and CSRF."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.models import ApiToken, Event, Run
from tests.base import drive, make_people, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def finished(people):
    """A run that went through its steps: it has snapshots to read."""
    return drive(make_run(user=people["operator"]))


@pytest.fixture
def run(people):
    """A queued run: it can still be cancelled."""
    return make_run(user=people["operator"])


def reads(run):
    return [
        "/api/runs",
        f"/api/runs/{run.pk}",
        f"/api/runs/{run.pk}/snapshots/1/pre",
        f"/api/ledger?run={run.pk}",
        "/api/inflight",
    ]


def writes(run):
    body = {"agent": "scripted", "input": {"goal": "g", "steps": [{"final": "x"}]}}
    return [
        ("/api/runs", body),
        (f"/api/runs/{run.pk}/cancel", {"reason": "no"}),
        (f"/api/runs/{run.pk}/approve", {"decision": "approve"}),
    ]


def as_user(user):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def counts():
    return Run.objects.count(), Event.objects.count()


def test_anonymous_callers_get_401_in_json_everywhere(finished, run):
    client = Client()
    for url in reads(finished):
        response = client.get(url)
        assert response.status_code == 401, url
        assert "authentication required" in response.json()["detail"]
        assert response["WWW-Authenticate"].startswith("Bearer")
    before = counts()
    for url, body in writes(run):
        assert client.post(url, body, content_type="application/json").status_code == 401, url
    assert counts() == before


def test_a_user_without_a_role_gets_403_everywhere(people, finished, run):
    client = as_user(people["outsider"])
    for url in reads(finished):
        response = client.get(url)
        assert response.status_code == 403, url
        assert "has no role" in response.json()["detail"]
    before = counts()
    for url, body in writes(run):
        assert client.post(url, body, content_type="application/json").status_code == 403, url
    assert counts() == before


def test_a_viewer_reads_everything(people, finished):
    client = as_user(people["viewer"])
    for url in reads(finished):
        assert client.get(url).status_code == 200, url


def test_a_viewers_posts_are_refused_and_change_nothing(people, run):
    client = as_user(people["viewer"])
    before = counts()
    for url, body in writes(run):
        response = client.post(url, body, content_type="application/json")
        assert response.status_code == 403, url
        assert "needs the operator role" in response.json()["detail"]
    assert counts() == before
    run.refresh_from_db()
    assert run.status == "queued"


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_operators_and_admins_may_start_and_cancel_runs(people, finished, run, role):
    client = as_user(people[role])
    for url in reads(finished):
        assert client.get(url).status_code == 200, url
    body = {"agent": "scripted", "input": {"goal": "g", "steps": [{"final": "x"}]}}
    assert client.post("/api/runs", body, content_type="application/json").status_code == 201
    response = client.post(f"/api/runs/{run.pk}/cancel", {}, content_type="application/json")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"


def test_a_bearer_token_works_without_a_session_or_csrf_token(people):
    token = ApiToken.issue(people["operator"])
    client = Client(enforce_csrf_checks=True, HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"agent": "scripted", "input": {"goal": "g", "steps": [{"final": "x"}]}}

    created = client.post("/api/runs", body, content_type="application/json")

    assert created.status_code == 201
    run = Run.objects.get(pk=created.json()["id"])
    assert run.created_by == people["operator"]
    assert client.get(f"/api/runs/{run.pk}").json()["created_by"] == "olga"
    assert ApiToken.objects.get(user=people["operator"]).last_used_at is not None


def test_using_a_token_again_soon_does_not_rewrite_last_used_at(people):
    token = ApiToken.issue(people["viewer"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    client.get("/api/runs")
    first = ApiToken.objects.get().last_used_at
    client.get("/api/runs")
    assert ApiToken.objects.get().last_used_at == first


def test_a_viewers_token_can_read_but_not_write(people):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['viewer'])}")
    assert client.get("/api/runs").status_code == 200
    before = counts()
    response = client.post(
        "/api/runs", {"agent": "scripted", "input": {}}, content_type="application/json"
    )
    assert response.status_code == 403
    assert counts() == before


def test_a_token_of_a_user_without_a_role_gets_403(people):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['outsider'])}")
    assert client.get("/api/runs").status_code == 403


@pytest.mark.parametrize(
    "header", ["Bearer art_not-a-real-token", "Bearer ", "Basic b2xnYTpwdw==", "art_no_scheme"]
)
def test_a_bad_authorization_header_is_401_even_with_a_session(people, header):
    client = as_user(people["operator"])
    response = client.get("/api/runs", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert response.json()["detail"]


def test_the_token_of_a_deactivated_user_stops_working(people):
    token = ApiToken.issue(people["operator"])
    people["operator"].is_active = False
    people["operator"].save()
    assert Client(HTTP_AUTHORIZATION=f"Bearer {token}").get("/api/runs").status_code == 401


def test_a_session_post_without_a_csrf_token_is_refused_in_json(people):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    before = counts()
    body = {"agent": "scripted", "input": {"goal": "g", "steps": [{"final": "x"}]}}

    response = client.post("/api/runs", body, content_type="application/json")

    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    assert "CSRF" in response.json()["detail"]
    assert counts() == before


def test_a_session_post_with_the_csrf_token_goes_through(people):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["operator"])
    secret = "a" * 32
    client.cookies["csrftoken"] = secret
    body = {"agent": "scripted", "input": {"goal": "g", "steps": [{"final": "x"}]}}

    response = client.post(
        "/api/runs", body, content_type="application/json", HTTP_X_CSRFTOKEN=secret
    )

    assert response.status_code == 201


def test_session_gets_need_no_csrf_token(people):
    client = Client(enforce_csrf_checks=True)
    client.force_login(people["viewer"])
    assert client.get("/api/runs").status_code == 200


def test_the_openapi_document_is_public():
    assert Client().get("/api/openapi.json").status_code == 200
