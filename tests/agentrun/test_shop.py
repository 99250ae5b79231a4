"""The shop agent: the demo story, its incident, retries, compensation and input checks."""

import copy
import json
import re
import time

import pytest
from django.utils import timezone

from agentrun import engine
from agentrun.agents import CallResult, InvalidInput, StepContext, get_agent
from agentrun.builtin.shop import STAGE_STEPS, STAGE_TOOLS, get_cart, get_recommendations
from agentrun.lifecycle import services
from agentrun.models import (
    Event,
    InventoryItem,
    LedgerEntry,
    OutboxMessage,
    Reservation,
    Run,
    Step,
    ToolCall,
)
from agentrun.store import snapshots
from agentrun.tools import ToolContext
from tests.base import drive, make_people

pytestmark = pytest.mark.django_db

CART = [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}]
INCIDENT = [{"after_step": 2, "remove": "STOVE-1"}]


def shop_input(**extra):
    return {"goal": "Get me ready for a weekend camping trip", "user": "ana", "cart": CART, **extra}


def start(**extra) -> Run:
    return services.start_run("shop", shop_input(**extra))


def drive_through_backoff(run: Run, timeout: float = 20) -> Run:
    """Drive the run, sleeping until its wake-up time whenever it parks in backoff."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        run = drive(run)
        if not (run.status == "waiting" and run.wait_reason == "backoff"):
            return run
        time.sleep(max((run.wake_at - timezone.now()).total_seconds(), 0) + 0.02)
        engine.execute_step(run.pk, run.next_step)  # drive() leaves parked runs alone
    raise AssertionError(f"run still {run.status} after {timeout}s")


def notes_of(run: Run, step: int, at: str = "post") -> dict:
    return snapshots.load(run.pk, step, at)["memory"]["notes"]


def tools_by_step(run: Run) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for tc in ToolCall.objects.filter(run=run).select_related("step"):
        out.setdefault(tc.step.number, []).append(tc.tool)
    return out


def reserved(sku: str) -> int:
    item = InventoryItem.objects.filter(sku=sku).first()
    return item.reserved if item else 0


@pytest.fixture
def people():
    return make_people()


def test_the_happy_path_succeeds_once_the_operator_approves_the_payment(people):
    run = drive(start())

    assert (run.status, run.wait_reason, run.next_step) == ("waiting", "approval", 7)
    charge = ToolCall.objects.get(run=run, tool="charge_payment")
    assert charge.status == "awaiting_approval"
    assert not LedgerEntry.objects.filter(run=run).exists()

    services.decide_approval(run, user=people["operator"], decision="approve", comment="ok")
    run = drive(run)

    assert run.status == "succeeded", run.error
    assert tools_by_step(run) == {
        1: ["search_products"],
        2: ["get_cart"],
        3: ["get_recommendations"],
        4: ["check_stock"],
        5: ["reserve", "reserve", "reserve"],
        6: ["shipping_quote"],
        7: ["charge_payment"],
        8: ["place_order"],
        9: ["notify"],
    }
    assert Step.objects.filter(run=run).count() == 10
    assert run.final_answer.startswith("Ordered 1 x Backpacking stove (STOVE-1), 1 x Two-person")
    ledger = {e.account: e.amount for e in LedgerEntry.objects.filter(run=run)}
    assert set(ledger) == {"payments:ana", "orders:ana"}
    # 59.90 + 189.00 + 6.90 (the recommended gas) + 4.90 + 1.50 * 3 kg of shipping
    assert float(ledger["payments:ana"]) == pytest.approx(265.20)
    assert OutboxMessage.objects.get(run=run).to == "ana@example.com"
    assert sorted(
        Reservation.objects.filter(run=run, released=False).values_list("sku", flat=True)
    ) == [
        "GAS-230",
        "STOVE-1",
        "TENT-2P",
    ]
    approved = Event.objects.get(run=run, kind="approved")
    assert approved.actor == "olga" and approved.step == 7


def test_the_stage_list_matches_the_steps_of_a_run():
    assert STAGE_STEPS["shipping"] == 6
    assert [STAGE_TOOLS.get(stage, "final") for stage in STAGE_STEPS] == [
        "search_products",
        "get_cart",
        "get_recommendations",
        "check_stock",
        "reserve",
        "shipping_quote",
        "charge_payment",
        "place_order",
        "notify",
        "final",
    ]


def test_the_incident_reproduces_the_agent_recommends_for_an_item_the_user_removed():
    run = drive(start(cart_changes=INCIDENT, approval=False))
    assert run.status == "succeeded", run.error

    # The world changed after step 2: the cart no longer has the stove...
    later = get_cart(ToolContext(str(run.pk), 4, 0, "k"), {"user": "ana"})
    assert [item["sku"] for item in later["items"]] == ["TENT-2P"]
    # ...but the agent works from the cart it read at step 2.
    assert "STOVE-1" in notes_of(run, 3, "pre")["cart"]
    recommend = Step.objects.get(run=run, number=3).decision
    assert recommend["calls"][0]["args"] == {"skus": ["STOVE-1", "TENT-2P"]}
    assert "read at step 2" in recommend["rationale"]
    assert Step.objects.get(run=run, number=4).thought.startswith(
        "Recommending Gas canister 230 g (GAS-230) "
        "because the cart has Backpacking stove (STOVE-1)."
    )
    held = set(Reservation.objects.filter(run=run).values_list("sku", flat=True))
    assert {"STOVE-1", "GAS-230"} <= held


def test_a_fork_at_the_recommendation_step_with_the_cart_corrected_recommends_correctly():
    run = drive(start(cart_changes=INCIDENT, approval=False))
    agent = get_agent("shop")
    state = copy.deepcopy(snapshots.load(run.pk, 3, "pre"))
    cart = json.loads(state["memory"]["notes"]["cart"])
    state["memory"]["notes"]["cart"] = json.dumps(
        [line for line in cart if line["sku"] != "STOVE-1"]
    )
    agent.validate_state(state)

    ctx = StepContext(str(run.pk), 3, run.input)
    decision = agent.decide(state, ctx)

    assert decision.calls[0].tool == "get_recommendations"
    assert decision.calls[0].args == {"skus": ["TENT-2P"]}
    assert "STOVE" not in decision.thought + decision.rationale

    # And the fork goes on from there: the next step recommends for the tent.
    result = get_recommendations(ToolContext(str(run.pk), 3, 0, "k"), decision.calls[0].args)
    answer = CallResult(0, "get_recommendations", "read", decision.calls[0].args, "ok", result)
    after = agent.update(state, decision, [answer], ctx)
    following = agent.decide(after, StepContext(str(run.pk), 4, run.input))
    assert following.thought.startswith(
        "Recommending Aluminium tent stakes, pack of 8 (STAKES-AL) "
        "because the cart has Two-person tent (TENT-2P)."
    )
    assert following.calls[0].args == {"skus": ["TENT-2P", "STAKES-AL"]}


def test_the_flaky_shipping_quote_at_step_6_is_retried_after_backoff():
    run = drive(start(shipping_timeouts=2, approval=False))
    assert (run.status, run.wait_reason, run.next_step) == ("waiting", "backoff", 6)
    assert run.wake_at is not None and run.wake_at > timezone.now() - timezone.timedelta(seconds=1)

    run = drive_through_backoff(run)

    assert run.status == "succeeded", run.error
    quote = ToolCall.objects.get(run=run, tool="shipping_quote")
    assert quote.step.number == 6 and quote.status == "ok"
    attempts = quote.attempts
    assert len(attempts) == 3
    assert "timed out" in attempts[0]["error"] and attempts[0]["backoff_s"] == pytest.approx(0.3)
    assert "timed out" in attempts[1]["error"] and attempts[1]["backoff_s"] == pytest.approx(0.6)
    assert attempts[2]["error"] is None
    assert Step.objects.get(run=run, number=6).attempts == 3
    assert json.loads(notes_of(run, 6)["shipping"])["attempts"] == 3


def test_a_declined_card_fails_the_run_and_releases_the_reservations():
    before = {sku: reserved(sku) for sku in ("STOVE-1", "TENT-2P", "GAS-230")}

    run = drive(start(fail_payment=True, approval=False))

    assert run.status == "failed"
    assert "card declined" in run.error
    failed = Step.objects.get(run=run, number=7)
    assert failed.status == "failed" and failed.failure["tool"] == "charge_payment"
    assert snapshots.load(run.pk, 7, "post")["failures"][-1]["type"] == "ToolError"
    holds = Reservation.objects.filter(run=run)
    assert holds.count() == 3 and all(h.released for h in holds)
    assert {sku: reserved(sku) for sku in before} == before
    assert set(
        ToolCall.objects.filter(run=run, tool="reserve").values_list("status", flat=True)
    ) == {"compensated"}
    assert not LedgerEntry.objects.filter(run=run).exists()


def test_the_crash_input_puts_the_fault_on_the_place_order_call(settings):
    settings.AGENTRUN_FAULTS = False  # disarmed: the fault is only recorded
    run = drive(start(crash="crash_after", approval=False))

    assert run.status == "succeeded", run.error
    calls = {n: Step.objects.get(run=run, number=n).decision["calls"] for n in range(1, 10)}
    assert [(n, c["tool"]) for n, cs in calls.items() for c in cs if c.get("fault")] == [
        (8, "place_order")
    ]
    assert LedgerEntry.objects.filter(run=run).count() == 2


def test_an_emptied_cart_ends_the_run_early_with_an_answer():
    changes = [{"after_step": 1, "remove": "STOVE-1"}, {"after_step": 1, "remove": "TENT-2P"}]
    run = drive(start(cart_changes=changes))

    assert run.status == "succeeded"
    assert run.next_step == 4
    assert run.final_answer == "The cart is empty, so there is nothing to order."


def test_a_hand_edited_cart_that_is_not_json_is_refused_with_its_path():
    run = drive(start(cart_changes=INCIDENT, approval=False))
    state = copy.deepcopy(snapshots.load(run.pk, 3, "pre"))
    state["memory"]["notes"]["cart"] = "[{'sku': 'TENT-2P'}"

    with pytest.raises(ValueError, match=r"^memory\.notes\.cart is not valid JSON"):
        get_agent("shop").validate_state(state)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"colour": "red"}, "unknown key(s) colour (known: goal, user, cart,"),
        ({"goal": ""}, "goal must be a non-empty string, got ''"),
        ({"user": None}, "user must be a non-empty string, got None"),
        ({"cart": []}, "cart must be a non-empty list of {sku, qty} objects"),
        ({"cart": ["STOVE-1"]}, "cart[0] must be an object with sku and qty"),
        ({"cart": [{"sku": "STOVE-1", "qty": 1, "price": 1}]}, "cart[0]: unknown key(s) price"),
        (
            {"cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "NOPE-1", "qty": 1}]},
            "cart[1].sku: unknown SKU 'NOPE-1' (known: TENT-2P,",
        ),
        (
            {"cart": [{"sku": "STOVE-1", "qty": 0}]},
            "cart[0].qty must be an integer from 1 to 99, got 0",
        ),
        (
            {"cart": [{"sku": "STOVE-1", "qty": True}]},
            "cart[0].qty must be an integer from 1 to 99, got True",
        ),
        (
            {"cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "STOVE-1", "qty": 2}]},
            "cart[1].sku: STOVE-1 is already in the cart (cart[0])",
        ),
        (
            {"cart_changes": {"remove": "STOVE-1"}},
            "cart_changes must be a list of {after_step, remove}",
        ),
        (
            {"cart_changes": [{"after_step": 0, "remove": "STOVE-1"}]},
            "cart_changes[0].after_step must be a positive integer, got 0",
        ),
        (
            {"cart_changes": [{"after_step": 2, "remove": "LAMP-H"}]},
            "cart_changes[0].remove: 'LAMP-H' is not in the cart (cart has: STOVE-1, TENT-2P)",
        ),
        ({"shipping_timeouts": 6}, "shipping_timeouts must be an integer from 0 to 5, got 6"),
        ({"shipping_timeouts": "2"}, "shipping_timeouts must be an integer from 0 to 5, got '2'"),
        ({"fail_payment": "yes"}, "fail_payment must be true or false, got 'yes'"),
        ({"approval": 1}, "approval must be true or false, got 1"),
        ({"crash": "boom"}, "crash must be one of crash_before, crash_after or null, got 'boom'"),
        ({"demo": 3}, "demo must be a string, got 3"),
    ],
)
def test_invalid_inputs_are_refused_with_a_message_naming_the_field(change, message):
    with pytest.raises(InvalidInput, match="^" + re.escape(message)):
        services.start_run("shop", shop_input(**change))
    assert not Run.objects.exists()


def test_an_input_that_is_not_an_object_is_refused():
    with pytest.raises(InvalidInput, match="^input must be a JSON object$"):
        services.start_run("shop", ["goal"])
