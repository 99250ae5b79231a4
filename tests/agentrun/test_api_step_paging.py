"""GET /api/runs/{id} pages a run's steps: steps_offset, steps_limit, totals, next offset."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.api import operations as api
from tests.base import make_people
from tests.debugger.long_runs import long_run
from tests.debugger.runs import walkthrough_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["viewer"])
    return client


def test_a_small_run_comes_whole_in_its_first_page(client, people):
    run = walkthrough_run(people["operator"])
    body = client.get(f"/api/runs/{run.pk}").json()
    assert [s["number"] for s in body["steps"]] == list(range(1, 9))
    assert body["steps_total"] == 8 and body["steps_offset"] == 0
    assert body["steps_limit"] == api.STEPS_DEFAULT_LIMIT
    assert body["steps_next_offset"] is None


def test_a_long_run_is_read_page_by_page_to_its_end(client, people):
    run = long_run(people["operator"], api.STEPS_DEFAULT_LIMIT + 50)
    first = client.get(f"/api/runs/{run.pk}").json()
    assert len(first["steps"]) == api.STEPS_DEFAULT_LIMIT
    assert first["steps_total"] == api.STEPS_DEFAULT_LIMIT + 50
    assert first["steps_next_offset"] == api.STEPS_DEFAULT_LIMIT
    numbers, offset = [], 0
    while offset is not None:
        page = client.get(f"/api/runs/{run.pk}?steps_offset={offset}&steps_limit=70").json()
        numbers += [s["number"] for s in page["steps"]]
        assert all(s["tool_calls"] for s in page["steps"][:-1] if s["number"] < 250)
        offset = page["steps_next_offset"]
    assert numbers == list(range(1, api.STEPS_DEFAULT_LIMIT + 51))


def test_an_offset_past_the_end_is_an_empty_page_with_the_total(client, people):
    run = walkthrough_run(people["operator"])
    body = client.get(f"/api/runs/{run.pk}?steps_offset=100").json()
    assert body["steps"] == [] and body["steps_total"] == 8
    assert body["steps_next_offset"] is None


@pytest.mark.parametrize(
    "query",
    [
        "steps_offset=-1",
        "steps_offset=abc",
        "steps_offset=1.5",
        f"steps_offset={api.MAX_OFFSET + 1}",
        "steps_limit=0",
        f"steps_limit={api.STEPS_MAX_LIMIT + 1}",
        "steps_limit=",
    ],
)
def test_bad_paging_values_are_refused_with_400(client, people, query):
    run = walkthrough_run(people["operator"])
    response = client.get(f"/api/runs/{run.pk}?{query}")
    assert response.status_code == 400, response.content
    name = query.split("=")[0]
    assert name in response.json()["detail"] or response.json().get("field") == name


def test_the_openapi_document_declares_the_paging(client):
    spec = client.get("/api/openapi.json").json()
    op = spec["paths"]["/api/runs/{run_id}"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert params["steps_limit"]["schema"]["maximum"] == api.STEPS_MAX_LIMIT
    assert params["steps_offset"]["schema"]["minimum"] == 0
    schema = spec["components"]["schemas"]["RunDetail"]["properties"]
    assert {"steps_total", "steps_offset", "steps_limit", "steps_next_offset"} <= set(schema)
