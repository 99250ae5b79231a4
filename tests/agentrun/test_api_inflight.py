"""GET /api/inflight: what the Now page shows, as JSON."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.models import ApiToken
from tests.base import make_in_flight, make_people

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    token = ApiToken.issue(make_people()["viewer"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


def test_it_answers_counts_the_worker_matrix_and_the_longest_waits_per_state(client):
    make_in_flight("deciding", 2, worker="w-a:1", waited=3)
    [acting] = make_in_flight("acting", worker="w-b:2", waited=60, tools=("search", "notify"))
    make_in_flight("backoff", 1, wake_in=300)
    make_in_flight("queued", 7)

    body = client.get("/api/inflight").json()
    assert body["counts"] == {
        "deciding": 2,
        "acting": 1,
        "backoff": 1,
        "approval": 0,
        "in_doubt": 0,
        "stalled": 0,
        "queued": 7,
    }
    assert (body["total"], body["in_flight"]) == (11, 4)
    assert [(w["worker"], w["total"]) for w in body["workers"]] == [
        ("w-a:1", 2),
        ("w-b:2", 1),
        (None, 8),
    ]
    assert body["workers"][0]["counts"]["deciding"] == 2
    groups = {g["state"]: g for g in body["groups"]}
    assert list(groups) == [
        "deciding",
        "acting",
        "backoff",
        "approval",
        "in_doubt",
        "stalled",
        "queued",
    ]
    assert (
        groups["queued"]["count"],
        len(groups["queued"]["items"]),
        groups["queued"]["more"],
    ) == (
        7,
        5,
        2,
    )
    [item] = groups["acting"]["items"]
    assert item["run_id"] == str(acting.pk) and item["worker"] == "w-b:2"
    assert item["lease_owner"] == acting.lease_owner and item["tools"] == ["search", "notify"]
    assert 60 <= item["waited_s"] < 120 and item["since"]
    assert item["call"]["tool"] == "search" and item["call"]["running"] is True
    [backoff] = groups["backoff"]["items"]
    assert backoff["worker"] is None and 240 < backoff["wake_in_s"] <= 300 and backoff["wake_at"]


def test_it_filters_by_state_worker_and_limit(client):
    make_in_flight("acting", 4, worker="w-a:1")
    make_in_flight("acting", 2, worker="w-b:2")
    body = client.get("/api/inflight?state=acting&worker=w-a:1&limit=3").json()
    [group] = body["groups"]
    assert group["state"] == "acting" and group["count"] == 4 and len(group["items"]) == 3
    assert {i["worker"] for i in group["items"]} == {"w-a:1"}
    assert body["filter"] == {"state": "acting", "worker": "w-a:1", "limit": 3}
    assert body["counts"]["acting"] == 6  # the counts are never filtered


@pytest.mark.parametrize(
    "query, message",
    [
        ("state=sleeping", "unknown state 'sleeping'"),
        ("limit=0", "limit must be between 1 and 500"),
        ("limit=501", "limit must be between 1 and 500"),
        ("limit=lots", "limit must be an integer"),
    ],
)
def test_bad_parameters_are_a_400(client, query, message):
    response = client.get(f"/api/inflight?{query}")
    assert response.status_code == 400 and message in response.json()["detail"]


def test_it_is_read_only(client):
    response = client.post("/api/inflight")
    assert response.status_code == 405 and response["Allow"] == "GET"
