"""POST /api/runs/{id}/fork and GET /api/runs/{id}/side-effects."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

from agentrun.api.operations import FORK_FIELDS, summary_json
from agentrun.models import (
    ApiToken,
    Event,
    LedgerEntry,
    LedgerInvocation,
    OutboxMessage,
    Reservation,
    Run,
    Snapshot,
    Step,
    ToolCall,
)
from agentrun.store import snapshots
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

#: Steps 1 echo (read); 2 ledger_write (write) + reserve (hybrid); 3 notify (write); 4 answer.
SIDE_EFFECTS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    calls({"tool": "notify", "args": {"to": "ana", "body": "booked"}}),
    final("booked"),
)
SIDE_EFFECT_KEYS = {
    "tool",
    "args",
    "idempotency_key",
    "step",
    "kind",
    "compensation",
    "status",
    "index",
}


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["operator"])
    return client


@pytest.fixture
def parent(people):
    return drive(make_run(SIDE_EFFECTS, user=people["operator"]))


def stored() -> tuple[int, int, int, int]:
    return (
        Run.objects.count(),
        Event.objects.count(),
        Snapshot.objects.count(),
        Step.objects.count(),
    )


def effects() -> tuple:
    return (
        LedgerEntry.objects.count(),
        dict(LedgerInvocation.objects.values_list("idempotency_key", "count")),
        Reservation.objects.count(),
        OutboxMessage.objects.count(),
    )


def hashes(run: Run) -> list[str]:
    return list(Snapshot.objects.filter(run=run).order_by("seq").values_list("hash", flat=True))


def post_fork(client: Client, run_id, body, **extra):
    return client.post(f"/api/runs/{run_id}/fork", body, content_type="application/json", **extra)


def fork(client: Client, run: Run, **body) -> dict:
    response = post_fork(client, run.pk, body)
    assert response.status_code == 201, response.content
    return response.json()


# --- forking --------------------------------------------------------------------------


def test_a_fork_from_a_pre_snapshot_is_201_with_the_new_runs_json(client, parent):
    before = hashes(parent)

    response = post_fork(client, parent.pk, {"step": 2, "at": "pre", "reason": "look again"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert response["Location"] == f"/api/runs/{body['id']}"
    assert body["parent_id"] == str(parent.pk)
    assert body["forked_from"] == {"step": 2, "at": "pre"}
    assert (body["mode"], body["divergence_step"]) == ("sandbox", None)
    assert (body["first_step"], body["next_step"], body["status"]) == (2, 2, "queued")
    assert (body["created_by"], body["steps"]) == ("olga", [])
    # The same shape as GET /api/runs/{id}.
    assert client.get(f"/api/runs/{body['id']}").json() == body
    event = Event.objects.get(run_id=body["id"], kind="run_forked")
    assert (event.actor, event.reason, event.payload["mode"]) == ("olga", "look again", "sandbox")

    run = drive(Run.objects.get(pk=body["id"]))

    detail = client.get(f"/api/runs/{run.pk}").json()
    assert detail["status"] == "succeeded"
    assert [s["number"] for s in detail["steps"]] == [2, 3, 4]
    assert detail["forked_from"] == {"step": 2, "at": "pre"}
    assert hashes(parent) == before
    # The fork shows up in the list too, with its lineage.
    listed = {r["id"]: r for r in client.get("/api/runs").json()["items"]}
    assert listed[str(run.pk)]["parent_id"] == str(parent.pk)


def test_a_fork_from_a_post_snapshot_starts_at_the_next_step(client, parent):
    body = fork(client, parent, step=1, at="post")

    assert body["forked_from"] == {"step": 1, "at": "post"}
    assert (body["first_step"], body["next_step"]) == (2, 2)
    pre = snapshots.get(body["id"], 2, "pre")
    assert pre.hash == snapshots.get(parent.pk, 1, "post").hash
    assert drive(Run.objects.get(pk=body["id"])).status == "succeeded"


def test_at_and_mode_default_to_pre_and_sandbox(client, parent):
    body = fork(client, parent, step=3)
    assert (body["forked_from"], body["mode"]) == ({"step": 3, "at": "pre"}, "sandbox")


def test_a_fork_with_an_edited_state_starts_from_that_state(client, parent):
    state = client.get(f"/api/runs/{parent.pk}/snapshots/3/pre").json()["state"]
    state["memory"]["goal"] = "book it for bea instead"

    body = fork(client, parent, step=3, state=state, reason="wrong person")

    assert snapshots.load(body["id"], 3, "pre") == state
    edits = Event.objects.get(run_id=body["id"], kind="run_forked").payload["edits"]
    assert edits == [["set", ["memory", "goal"], "book it for bea instead"]]


def test_an_explicit_null_state_is_the_snapshots_own(client, parent):
    body = fork(client, parent, step=2, state=None)
    assert snapshots.get(body["id"], 2, "pre").hash == snapshots.get(parent.pk, 2, "pre").hash


def test_a_running_parent_waiting_for_approval_can_be_forked(client, people):
    waiting = drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"n": 1}}),
                calls(
                    {
                        "tool": "ledger_write",
                        "args": {"account": "a", "amount": 1},
                        "approval": True,
                    }
                ),
                final("x"),
            )
        )
    )
    assert (waiting.status, waiting.wait_reason) == ("waiting", "approval")

    body = fork(client, waiting, step=1, at="post")
    run = drive(Run.objects.get(pk=body["id"]))

    assert run.status == "succeeded"  # sandbox: the write is skipped, so nothing to approve
    assert Run.objects.get(pk=waiting.pk).status == "waiting"
    assert not LedgerEntry.objects.exists()


def test_a_fork_of_a_fork(client, parent):
    child = drive(Run.objects.get(pk=fork(client, parent, step=2)["id"]))

    body = fork(client, child, step=3, at="pre", mode="recorded")

    assert body["parent_id"] == str(child.pk)
    assert body["forked_from"] == {"step": 3, "at": "pre"}
    grandchild = drive(Run.objects.get(pk=body["id"]))
    assert grandchild.status == "succeeded"
    assert grandchild.lineage() == [parent, child, grandchild]


def test_sandbox_mode_via_the_api_runs_no_write_or_hybrid_tool(client, parent):
    before = effects()

    run = drive(Run.objects.get(pk=fork(client, parent, step=1, mode="sandbox")["id"]))

    assert run.status == "succeeded"
    assert effects() == before
    side = ToolCall.objects.filter(run=run, kind__in=("write", "hybrid"))
    assert side.count() == 3 and set(side.values_list("status", flat=True)) == {"skipped"}


def test_recorded_mode_via_the_api_replays_the_parents_calls(client, parent):
    before = effects()

    run = drive(Run.objects.get(pk=fork(client, parent, step=3, mode="recorded")["id"]))

    assert run.status == "succeeded"
    assert run.mode == "recorded"
    replayed = ToolCall.objects.get(run=run, step__number=3)
    assert (replayed.tool, replayed.status) == ("notify", "replayed")
    assert Step.objects.get(run=run, number=3).decision_count == 0
    assert effects() == before


def test_live_mode_without_confirmation_is_refused_listing_the_calls_it_would_redo(client, parent):
    counts = stored()

    response = post_fork(client, parent.pk, {"step": 2, "mode": "live"})

    assert response.status_code == 400
    body = response.json()
    assert body["field"] == "confirm_live"
    assert "confirm_live" in body["detail"] and "3 write/hybrid" in body["detail"]
    listed = body["side_effects"]
    assert [(e["step"], e["tool"], e["kind"]) for e in listed] == [
        (2, "ledger_write", "write"),
        (2, "reserve", "hybrid"),
        (3, "notify", "write"),
    ]
    assert all(set(e) == SIDE_EFFECT_KEYS for e in listed)
    keys = dict(ToolCall.objects.filter(run=parent).values_list("tool", "idempotency_key"))
    assert {e["tool"]: e["idempotency_key"] for e in listed} == {
        tool: keys[tool] for tool in ("ledger_write", "reserve", "notify")
    }
    assert listed[0]["args"] == {"account": "acme", "amount": 10}
    assert stored() == counts
    # The same list as GET .../side-effects, which a UI shows before asking.
    shown = client.get(f"/api/runs/{parent.pk}/side-effects?step=2&at=pre").json()
    assert shown["side_effects"] == listed and shown["confirm_live_required"] is True


def test_a_confirmed_live_fork_runs_for_real_with_its_own_keys(client, parent):
    body = fork(client, parent, step=2, mode="live", confirm_live=True, reason="redo it")
    run = drive(Run.objects.get(pk=body["id"]))

    assert run.status == "succeeded"
    assert body["mode"] == "live"
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert LedgerEntry.objects.filter(run=parent).count() == 1
    parent_keys = set(ToolCall.objects.filter(run=parent).values_list("idempotency_key", flat=True))
    fork_keys = set(ToolCall.objects.filter(run=run).values_list("idempotency_key", flat=True))
    assert fork_keys and not parent_keys & fork_keys


def test_a_live_fork_with_nothing_to_redo_needs_no_confirmation(client, parent):
    body = fork(client, parent, step=3, at="post", mode="live")
    assert body["mode"] == "live"
    assert drive(Run.objects.get(pk=body["id"])).status == "succeeded"


def test_an_operator_with_a_bearer_token_can_fork(people, parent):
    token = ApiToken.issue(people["operator"])
    response = post_fork(Client(), parent.pk, {"step": 2}, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 201, response.content
    assert response.json()["created_by"] == "olga"


# --- refusals: a clear 4xx, nothing stored ----------------------------------------------


def assert_refused(response, status: int, message: str, field: str | None = None) -> dict:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert message in body["detail"], body
    if field is not None:
        assert body.get("field") == field, body
    return body


BAD_FORKS = [
    pytest.param({"step": 9}, "no pre snapshot of step 9 (steps 1..4)", "step", id="step too big"),
    pytest.param({"step": 0}, "no pre snapshot of step 0", "step", id="step 0"),
    pytest.param({"step": -1}, "no pre snapshot of step -1", "step", id="step negative"),
    pytest.param({"step": 10**12}, "out of range", "step", id="step huge"),
    pytest.param({"step": 4, "at": "post"}, "nothing would run", "state", id="after the end"),
    pytest.param({}, "step is required", "step", id="no step"),
    pytest.param({"step": "2"}, "step must be an integer", "step", id="step a string"),
    pytest.param({"step": True}, "step must be an integer", "step", id="step a boolean"),
    pytest.param({"step": 2.5}, "step must be an integer", "step", id="step a float"),
    pytest.param({"step": None}, "step must be an integer", "step", id="step null"),
    pytest.param({"step": 2, "at": "middle"}, 'at must be "pre" or "post"', "at", id="bad at"),
    pytest.param({"step": 2, "at": 1}, "at must be a string", "at", id="at a number"),
    pytest.param({"step": 2, "mode": "yolo"}, "mode must be one of", "mode", id="bad mode"),
    pytest.param({"step": 2, "mode": ""}, "mode must be one of", "mode", id="empty mode"),
    pytest.param({"step": 2, "mode": None}, "mode must be a string", "mode", id="mode null"),
    pytest.param({"step": 2, "reason": 5}, "reason must be a string", "reason", id="bad reason"),
    pytest.param(
        {"step": 2, "confirm_live": "yes"},
        "confirm_live must be true or false",
        "confirm_live",
        id="confirm_live a string",
    ),
    pytest.param(
        {"step": 2, "confirm_live": 1},
        "confirm_live must be true or false",
        "confirm_live",
        id="confirm_live a number",
    ),
    pytest.param(
        {"step": 2, "state": []}, "state must be a JSON object or null", "state", id="state a list"
    ),
    pytest.param(
        {"step": 2, "state": "{}"}, "state must be a JSON object or null", "state", id="state text"
    ),
    pytest.param(
        {"step": 2, "state": {"phase": "bogus"}}, "state: phase", "state", id="phase bogus"
    ),
    pytest.param(
        {"step": 2, "state": {"phase": "planning", "memory": {"notes": []}}},
        "memory.notes",
        "state",
        id="notes a list",
    ),
    pytest.param({"step": 2, "force": True}, "unknown field(s): force", None, id="unknown field"),
]


@pytest.mark.parametrize(("body", "message", "field"), BAD_FORKS)
def test_an_invalid_fork_is_a_400_naming_the_field_and_stores_nothing(
    client, parent, body, message, field
):
    counts, before = stored(), hashes(parent)
    assert_refused(post_fork(client, parent.pk, body), 400, message, field)
    assert stored() == counts
    assert hashes(parent) == before


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param('{"step": 2', "not valid JSON", id="truncated"),
        pytest.param("step=2", "not valid JSON", id="a form"),
        pytest.param('{"step": 2, "state": {"x": NaN}}', "not valid JSON", id="NaN"),
        pytest.param('{"step": 2, "reason": "a\\u0000b"}', "NUL", id="NUL"),
        pytest.param("[2]", "must be a JSON object", id="a list"),
        pytest.param("", "step is required", id="empty"),
    ],
)
def test_an_invalid_json_body_is_a_400_and_stores_nothing(client, parent, raw, message):
    counts = stored()
    response = client.generic(
        "POST", f"/api/runs/{parent.pk}/fork", raw, content_type="application/json"
    )
    assert_refused(response, 400, message)
    assert stored() == counts


@pytest.mark.parametrize(
    ("run_id", "message"),
    [
        pytest.param(str(uuid.uuid4()), "no run", id="unknown run"),
        pytest.param("not-a-uuid", "not a valid run id", id="bad UUID"),
    ],
)
def test_forking_a_run_that_does_not_exist_is_a_404(client, parent, run_id, message):
    counts = stored()
    assert_refused(post_fork(client, run_id, {"step": 2}), 404, message)
    assert stored() == counts


def test_a_viewer_may_not_fork(people, parent):
    counts = stored()
    viewer = Client()
    viewer.force_login(people["viewer"])
    assert_refused(post_fork(viewer, parent.pk, {"step": 2}), 403, "operator role")
    token = ApiToken.issue(people["viewer"])
    response = post_fork(Client(), parent.pk, {"step": 2}, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert_refused(response, 403, "operator role")
    assert stored() == counts


def test_no_role_no_login_and_no_csrf_token_are_refused(people, parent):
    counts = stored()
    outsider = Client()
    outsider.force_login(people["outsider"])
    assert_refused(post_fork(outsider, parent.pk, {"step": 2}), 403, "no role")
    assert_refused(post_fork(Client(), parent.pk, {"step": 2}), 401, "authentication required")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people["operator"])
    assert_refused(post_fork(strict, parent.pk, {"step": 2}), 403, "CSRF")
    assert stored() == counts


def test_get_on_the_fork_url_is_a_405(client, parent):
    response = client.get(f"/api/runs/{parent.pk}/fork")
    assert_refused(response, 405, "not allowed")
    assert response["Allow"] == "POST"


def test_a_parent_whose_agent_is_gone_is_a_409(client, parent):
    Run.objects.filter(pk=parent.pk).update(agent="retired")
    counts = stored()
    assert_refused(post_fork(client, parent.pk, {"step": 2}), 409, "unknown agent 'retired'")
    assert stored() == counts


# --- side effects -------------------------------------------------------------------------


def test_side_effects_lists_the_parents_write_and_hybrid_calls_after_the_fork_point(client, parent):
    def listed(query):
        response = client.get(f"/api/runs/{parent.pk}/side-effects?{query}")
        assert response.status_code == 200, response.content
        return response.json()

    body = listed("step=2&at=pre")
    assert (body["run_id"], body["step"], body["at"]) == (str(parent.pk), 2, "pre")
    assert [(e["step"], e["index"], e["tool"]) for e in body["side_effects"]] == [
        (2, 0, "ledger_write"),
        (2, 1, "reserve"),
        (3, 0, "notify"),
    ]
    assert all(set(e) == SIDE_EFFECT_KEYS for e in body["side_effects"])
    assert body["side_effects"][1]["status"] == "ok"
    assert [e["tool"] for e in listed("step=2&at=post")["side_effects"]] == ["notify"]
    assert [e["tool"] for e in listed("step=2")["side_effects"]] == [
        "ledger_write",
        "reserve",
        "notify",
    ]
    nothing = listed("step=3&at=post")
    assert nothing["side_effects"] == [] and nothing["confirm_live_required"] is False
    assert len(listed("step=1&at=pre")["side_effects"]) == 3


def test_a_viewer_may_read_the_side_effects(people, parent):
    viewer = Client()
    viewer.force_login(people["viewer"])
    response = viewer.get(f"/api/runs/{parent.pk}/side-effects?step=1")
    assert response.status_code == 200
    assert len(response.json()["side_effects"]) == 3


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        pytest.param("", 400, "the step parameter is required", id="no step"),
        pytest.param("step=two", 400, "step must be an integer", id="step not a number"),
        pytest.param("step=9", 400, "no pre snapshot of step 9 (steps 1..4)", id="no such step"),
        pytest.param("step=99999999999", 400, "step must be between", id="step huge"),
        pytest.param("step=2&at=middle", 400, 'at must be "pre" or "post"', id="bad at"),
        pytest.param("step=2&at=%00", 400, "NUL", id="NUL"),
    ],
)
def test_bad_side_effect_queries_are_a_400(client, parent, query, status, message):
    assert_refused(client.get(f"/api/runs/{parent.pk}/side-effects?{query}"), status, message)


def test_side_effects_of_an_unknown_run_are_a_404(client):
    assert_refused(client.get(f"/api/runs/{uuid.uuid4()}/side-effects?step=1"), 404, "no run")
    assert_refused(client.get("/api/runs/nope/side-effects?step=1"), 404, "not a valid run id")


# --- the contract --------------------------------------------------------------------------


def test_the_openapi_document_describes_forking(client, parent):
    doc = Client().get("/api/openapi.json").json()
    schemas = doc["components"]["schemas"]
    post = doc["paths"]["/api/runs/{run_id}/fork"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Fork"
    }
    assert {"201", "400", "403", "404"} <= set(post["responses"])
    assert set(schemas["Fork"]["properties"]) == set(FORK_FIELDS)
    assert schemas["Fork"]["required"] == ["step"]
    get = doc["paths"]["/api/runs/{run_id}/side-effects"]["get"]
    assert {p["name"] for p in get["parameters"]} == {"run_id", "step", "at"}
    assert set(schemas["SideEffect"]["properties"]) == SIDE_EFFECT_KEYS
    # Every member of a run's JSON is documented, the fork's lineage included.
    child = Run.objects.get(pk=fork(client, parent, step=2)["id"])
    assert set(summary_json(child)) == set(schemas["RunSummary"]["properties"])
    assert {"parent_id", "forked_from", "mode", "divergence_step"} <= set(summary_json(child))
