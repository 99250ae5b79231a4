"""The stale-cart incident, end to end: reproduce it, fix it with a fork through the API.

The user removes STOVE-1 after step 2; at step 3 the agent recommends (and then
reserves) a gas canister for it, because memory.notes.cart still holds the cart
it read at step 2. The operator forks at the pre snapshot of step 3 with the
cart corrected, in sandbox mode, and the fork recommends for the tent instead,
without charging, reserving, ordering or e-mailing anything, and without
touching the incident run.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentrun.builtin.shop import STAGE_STEPS
from agentrun.lifecycle import services
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
from agentrun.store import delta, snapshots
from tests.base import drive, make_people

pytestmark = pytest.mark.django_db

REMOVED = "STOVE-1"
RECOMMEND = STAGE_STEPS["recommend"]  # 3
LAST = STAGE_STEPS["answer"]  # 10
INCIDENT = {
    "goal": "Get me ready for a weekend camping trip",
    "user": "ben",
    "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
    "cart_changes": [{"after_step": 2, "remove": REMOVED}],
    "approval": False,
}


@pytest.fixture
def api():
    """A client that calls the API as Olga, an operator, with a Bearer token."""
    token = ApiToken.issue(make_people()["operator"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}")


@pytest.fixture
def incident():
    run = drive(services.start_run("shop", INCIDENT), through_backoff=True)
    assert run.status == "succeeded", run.error
    return run


def side_effects() -> tuple:
    """Everything a write/hybrid tool leaves behind, anywhere."""
    return (
        LedgerEntry.objects.count(),
        dict(LedgerInvocation.objects.values_list("idempotency_key", "count")),
        Reservation.objects.count(),
        Reservation.objects.filter(released=True).count(),
        OutboxMessage.objects.count(),
    )


def hashes(run: Run) -> list[tuple[int, str]]:
    return list(Snapshot.objects.filter(run=run).order_by("seq").values_list("seq", "hash"))


def notes(run: Run, step: int, at: str = "post") -> dict:
    return snapshots.load(run.pk, step, at)["memory"]["notes"]


def recommendation(run: Run) -> dict:
    return json.loads(notes(run, RECOMMEND)["recommendation"])


def tools_by_step(run: Run) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for number, tool in ToolCall.objects.filter(run=run).values_list("step__number", "tool"):
        out.setdefault(number, set()).add(tool)
    return out


def fork(api: Client, run: Run, **body) -> dict:
    response = api.post(f"/api/runs/{run.pk}/fork", body, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


def test_the_incident_is_fixed_by_a_sandbox_fork_with_the_cart_corrected(api, incident):
    # The incident: the stove was removed after step 2, yet recommended for and reserved.
    remembered = json.loads(notes(incident, RECOMMEND, "pre")["cart"])
    assert REMOVED in {line["sku"] for line in remembered}
    assert (
        REMOVED
        in Step.objects.get(run=incident, number=RECOMMEND).decision["calls"][0]["args"]["skus"]
    )
    assert recommendation(incident)["for_sku"] == REMOVED
    assert recommendation(incident)["sku"] == "GAS-230"
    assert {"STOVE-1", "GAS-230"} <= set(
        Reservation.objects.filter(run=incident).values_list("sku", flat=True)
    )
    assert "to go with the backpacking stove" in incident.final_answer
    parent_hashes, before = hashes(incident), side_effects()
    parent_steps = list(Step.objects.filter(run=incident).order_by("number").values_list("pk"))

    # The operator reads the state the agent decided from, and corrects the cart in it.
    snap = api.get(f"/api/runs/{incident.pk}/snapshots/{RECOMMEND}/pre").json()
    state = snap["state"]
    cart = json.loads(state["memory"]["notes"]["cart"])
    state["memory"]["notes"]["cart"] = json.dumps([x for x in cart if x["sku"] != REMOVED])
    body = fork(
        api,
        incident,
        step=RECOMMEND,
        at="pre",
        state=state,
        mode="sandbox",
        reason="cart change never reached the agent's context",
    )
    assert body["parent_id"] == str(incident.pk)
    assert body["forked_from"] == {"step": RECOMMEND, "at": "pre"}
    assert (body["mode"], body["divergence_step"], body["created_by"]) == ("sandbox", None, "olga")

    fixed = drive(Run.objects.get(pk=body["id"]), through_backoff=True)

    assert fixed.status == "succeeded", fixed.error
    # It recommends for what is really in the cart, and the removed stove is gone for good.
    args = Step.objects.get(run=fixed, number=RECOMMEND).decision["calls"][0]["args"]
    assert args == {"skus": ["TENT-2P"]}
    assert recommendation(fixed)["for_sku"] == "TENT-2P"
    assert recommendation(fixed)["sku"] == "STAKES-AL"
    lines = json.loads(notes(fixed, LAST)["order_lines"])
    assert [line["sku"] for line in lines] == ["TENT-2P", "STAKES-AL"]
    assert "to go with the two-person tent" in fixed.final_answer
    assert REMOVED not in fixed.final_answer and "Gas canister" not in fixed.final_answer
    assert Step.objects.get(run=fixed, number=RECOMMEND + 1).thought.startswith(
        "Recommending Aluminium tent stakes, pack of 8 (STAKES-AL) "
        "because the cart has Two-person tent (TENT-2P)."
    )

    # No write/hybrid tool ran: no charge, order, reservation or e-mail, anywhere.
    assert side_effects() == before
    written = ToolCall.objects.filter(run=fixed, kind__in=("write", "hybrid"))
    assert set(written.values_list("tool", flat=True)) == {
        "reserve",
        "charge_payment",
        "place_order",
        "notify",
    }
    assert set(written.values_list("status", flat=True)) == {"skipped"}

    # The incident run is untouched.
    assert hashes(incident) == parent_hashes
    assert list(Step.objects.filter(run=incident).order_by("number").values_list("pk")) == (
        parent_steps
    )
    incident_now = Run.objects.get(pk=incident.pk)
    assert (incident_now.status, incident_now.final_answer) == (
        "succeeded",
        incident.final_answer,
    )

    # The steps align: the fork numbers on from the fork point, stage for stage.
    assert fixed.first_step == RECOMMEND
    numbers = list(
        Step.objects.filter(run=fixed).order_by("number").values_list("number", flat=True)
    )
    assert numbers == list(range(RECOMMEND, LAST + 1))
    parent_tools, fork_tools = tools_by_step(incident), tools_by_step(fixed)
    assert {n: fork_tools[n] for n in fork_tools} == {
        n: parent_tools[n] for n in parent_tools if n >= RECOMMEND
    }
    # The fork started from the parent's state with exactly one edit, recorded.
    source = snapshots.load(incident.pk, RECOMMEND, "pre")
    start = snapshots.load(fixed.pk, RECOMMEND, "pre")
    assert [path for _, path, *_ in delta.diff(source, start)] == [["memory", "notes", "cart"]]
    event = Event.objects.get(run=fixed, kind="run_forked")
    assert (event.actor, event.reason) == ("olga", "cart change never reached the agent's context")
    assert [path for _, path, *_ in event.payload["edits"]] == [["memory", "notes", "cart"]]


def test_a_recorded_fork_of_the_unedited_incident_reproduces_it_without_calling_anything(
    api, incident
):
    before, parent_hashes = side_effects(), hashes(incident)

    body = fork(api, incident, step=1, at="pre", mode="recorded", reason="reproduce")
    replay = drive(Run.objects.get(pk=body["id"]), through_backoff=True)

    assert replay.status == "succeeded", replay.error
    assert replay.divergence_step is None
    final = snapshots.get(replay.pk, LAST, "post").hash
    assert final == snapshots.get(incident.pk, LAST, "post").hash
    assert replay.final_answer == incident.final_answer
    assert side_effects() == before
    assert set(ToolCall.objects.filter(run=replay).values_list("status", flat=True)) == {"replayed"}
    assert set(Step.objects.filter(run=replay).values_list("decision_count", flat=True)) == {0}
    assert hashes(incident) == parent_hashes
