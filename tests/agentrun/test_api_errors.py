"""Bad requests get a clear JSON error, never a 500 or HTML, and store nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from agentrun.models import Event, Run
from tests.base import calls, final, make_people, make_run, script

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    client = Client()
    client.force_login(make_people()["operator"])
    return client


def counts():
    return Run.objects.count(), Event.objects.count()


def post_raw(client, url, raw):
    return client.generic("POST", url, raw, content_type="application/json")


def assert_json_error(response, status, *words):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    detail = response.json()["detail"]
    for word in words:
        assert word in detail, detail
    return detail


ECHO = {"tool": "echo", "args": {}}

BAD_RUNS = [
    pytest.param(
        {"agent": "nobody", "input": script(final())}, "unknown agent 'nobody'", id="unknown agent"
    ),
    pytest.param({"agent": "", "input": script(final())}, "agent", id="empty agent"),
    pytest.param(
        {"agent": 7, "input": script(final())}, "agent must be a string", id="agent not a string"
    ),
    pytest.param({"input": script(final())}, "agent is required", id="no agent"),
    pytest.param({"agent": "scripted"}, "input is required", id="no input"),
    pytest.param(
        {"agent": "scripted", "input": [1]}, "input must be a JSON object", id="input a list"
    ),
    pytest.param(
        {"agent": "scripted", "input": "go"}, "input must be a JSON object", id="input a string"
    ),
    pytest.param(
        {"agent": "scripted", "input": script(final()), "priority": 1},
        "unknown field(s): priority",
        id="unknown field",
    ),
    pytest.param(
        {"agent": "scripted", "input": {"goal": "g", "steps": []}},
        "steps must be a non-empty list",
        id="empty script",
    ),
    pytest.param(
        {"agent": "scripted", "input": {"goal": 5, "steps": [final()]}},
        "goal must be a string",
        id="goal of wrong type",
    ),
    pytest.param(
        {"agent": "scripted", "input": script({"calls": [ECHO], "final": "x"})},
        "steps[0] needs exactly one of calls or final",
        id="step with calls and final",
    ),
    pytest.param(
        {"agent": "scripted", "input": script({"thought": "?"})},
        "steps[0] needs exactly one of calls or final",
        id="step with neither",
    ),
    pytest.param(
        {"agent": "scripted", "input": script(calls({"tool": "rm_rf", "args": {}}))},
        "steps[0].calls[0].tool: unknown tool 'rm_rf'",
        id="unknown tool",
    ),
    pytest.param(
        {"agent": "scripted", "input": script(calls({"tool": "echo", "args": "x=1"}))},
        "steps[0].calls[0].args: args must be an object",
        id="args of wrong type",
    ),
    pytest.param(
        {
            "agent": "scripted",
            "input": script(calls({"tool": "ledger_write", "args": {"account": "a"}})),
        },
        "missing argument(s) amount",
        id="missing tool argument",
    ),
    pytest.param(
        {"agent": "scripted", "input": script(calls({**ECHO, "approval": "yes"}))},
        "approval must be true or false",
        id="approval of wrong type",
    ),
    pytest.param(
        {"agent": "scripted", "input": script({"calls": ECHO})},
        "calls must be a list",
        id="calls not a list",
    ),
    pytest.param(
        {"agent": "scripted", "input": script(final(), {"final": 42})},
        "steps[1].final must be a string",
        id="final of wrong type",
    ),
    pytest.param(
        {"agent": "scripted", "input": script("step")},
        "steps[0] must be an object",
        id="step not an object",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_RUNS)
def test_an_invalid_run_is_a_400_naming_the_problem_and_nothing_is_stored(client, body, message):
    before = counts()

    response = client.post("/api/runs", body, content_type="application/json")

    assert_json_error(response, 400, message)
    assert counts() == before


BAD_BODIES = [
    pytest.param(b'{"agent": "scripted", "input": ', "not valid JSON", id="truncated"),
    pytest.param(b"agent=scripted", "not valid JSON", id="form encoded"),
    pytest.param(b"[1, 2]", "must be a JSON object", id="a list"),
    pytest.param(b'"scripted"', "must be a JSON object", id="a string"),
    pytest.param(b"null", "must be a JSON object", id="null"),
    pytest.param(b"", "agent is required", id="empty"),
    pytest.param(b"\xff\xfe\x00garbage", "not valid JSON", id="not utf-8"),
    pytest.param(b'{"agent": "scripted", "input": {"goal": NaN, "steps": []}}', "NaN", id="NaN"),
    pytest.param(
        b'{"agent": "scripted", "input": {"goal": 1e999, "steps": []}}',
        "out of range",
        id="infinite number",
    ),
    pytest.param(
        b'{"agent": "scripted", "input": {"goal": "a\\u0000b", "steps": [{"final": "x"}]}}',
        "$.input.goal contains a NUL character",
        id="NUL in a string",
    ),
    pytest.param(
        b'{"agent": "scripted", "input": {"goal": "\\ud800", "steps": [{"final": "x"}]}}',
        "lone surrogate",
        id="lone surrogate",
    ),
    pytest.param(
        b'{"agent": "scripted", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
        id="deep nesting",
    ),
    pytest.param(
        b'{"agent": "scripted", "input": {"goal": ' + b"9" * 5000 + b"}}",
        "not valid JSON",
        id="huge integer",
    ),
]


@pytest.mark.parametrize(("raw", "message"), BAD_BODIES)
def test_a_malformed_body_is_a_400_and_nothing_is_stored(client, raw, message):
    before = counts()

    response = post_raw(client, "/api/runs", raw)

    assert_json_error(response, 400, message)
    assert counts() == before


def test_a_10_mb_body_is_a_413_and_nothing_is_stored(client):
    before = counts()
    huge = {"agent": "scripted", "input": script(final("x" * (10 * 1024 * 1024)))}

    response = client.post("/api/runs", huge, content_type="application/json")

    assert_json_error(response, 413, "too large")
    assert counts() == before


def test_an_input_over_the_run_input_limit_is_a_400_and_nothing_is_stored(client, settings):
    settings.AGENTRUN_MAX_INPUT_BYTES = 1000
    before = counts()
    big = {"agent": "scripted", "input": script(final("x" * 2000))}

    response = client.post("/api/runs", big, content_type="application/json")

    assert_json_error(response, 400, "the limit is 1000")
    assert counts() == before


def test_a_10_mb_body_with_a_token_is_also_a_413():
    from agentrun.models import ApiToken

    token = ApiToken.issue(make_people()["operator"])
    raw = json.dumps({"agent": "scripted", "input": script(final("x" * (10 * 1024 * 1024)))})
    response = Client().generic(
        "POST",
        "/api/runs",
        raw,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert_json_error(response, 413, "too large")
    assert Run.objects.count() == 0


INVALID_IDS = ["not-a-uuid", "1234", "0" * 40, "%20", "g" * 32, "'; DROP TABLE agentrun_run; --"]


@pytest.mark.parametrize("run_id", [*INVALID_IDS, str(uuid.uuid4())])
def test_an_invalid_or_unknown_run_id_is_a_json_404_everywhere(client, run_id):
    before = counts()
    for response in (
        client.get(f"/api/runs/{run_id}"),
        client.get(f"/api/runs/{run_id}/snapshots/1/pre"),
        client.post(f"/api/runs/{run_id}/cancel", {}, content_type="application/json"),
        client.post(
            f"/api/runs/{run_id}/approve", {"decision": "approve"}, content_type="application/json"
        ),
    ):
        assert_json_error(response, 404, "no run")
    assert counts() == before


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "the run parameter is required"),
        ("?run=", "the run parameter is required"),
        ("?run=not-a-uuid", "run must be a run id"),
        ("?run=%00", "NUL"),
    ],
)
def test_the_ledger_needs_a_valid_run_parameter(client, query, message):
    assert_json_error(client.get(f"/api/ledger{query}"), 400, message)


def test_the_ledger_of_an_unknown_run_is_a_404(client):
    assert_json_error(client.get(f"/api/ledger?run={uuid.uuid4()}"), 404, "no run")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=0", "limit must be between 1 and 500"),
        ("limit=501", "limit must be between 1 and 500"),
        ("limit=ten", "limit must be an integer"),
        ("limit=1.5", "limit must be an integer"),
        ("offset=-1", "offset must be between 0"),
        ("offset=" + "9" * 30, "offset must be between 0"),
        ("offset=" + "9" * 5000, "offset must be an integer"),
        ("status=done", "unknown status 'done'"),
        ("status=SUCCEEDED", "unknown status"),
        ("agent=%00", "NUL"),
    ],
)
def test_bad_list_parameters_are_a_400(client, query, message):
    assert_json_error(client.get(f"/api/runs?{query}"), 400, message)


def test_list_parameters_at_their_bounds_are_fine(client):
    make_run()
    assert client.get("/api/runs?limit=1&offset=0").json()["count"] == 1
    assert client.get("/api/runs?limit=500").status_code == 200


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("DELETE", "/api/runs"),
        ("PUT", "/api/runs/{id}"),
        ("GET", "/api/runs/{id}/cancel"),
        ("POST", "/api/ledger"),
        ("POST", "/api/openapi.json"),
    ],
)
def test_a_wrong_method_is_a_json_405(client, method, url):
    run = make_run()
    response = client.generic(method, url.format(id=run.pk))
    assert_json_error(response, 405, "not allowed")
    assert response["Allow"]


@pytest.mark.parametrize("body", [{"reason": 5}, {"reason": "x", "force": True}])
def test_a_bad_cancel_body_is_a_400_and_the_run_keeps_going(client, body):
    run = make_run()
    response = client.post(f"/api/runs/{run.pk}/cancel", body, content_type="application/json")
    assert_json_error(response, 400)
    run.refresh_from_db()
    assert run.status == "queued"


def test_hostile_text_in_a_run_comes_back_verbatim_as_json(client):
    hostile = "<script>alert(1)</script> ' \" \\ \u202e"
    run_id = client.post(
        "/api/runs",
        {"agent": "scripted", "input": script(final(hostile), goal=hostile)},
        content_type="application/json",
    ).json()["id"]
    response = client.get(f"/api/runs/{run_id}")
    assert response["Content-Type"] == "application/json"
    assert Run.objects.get(pk=run_id).input["goal"] == hostile
