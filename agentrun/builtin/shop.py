"""The `shop` agent: the demo story, with a deterministic policy (no LLM).

It shops for a user, one stage per step:

     1 search_products       5 reserve (hybrid)          9 notify (the e-mail)
     2 get_cart              6 shipping_quote (flaky)   10 final answer
     3 get_recommendations   7 charge_payment (approval)
     4 check_stock           8 place_order

The policy picks the next stage from the state alone (memory.completed and
memory.notes), never from process memory, so a fork from any snapshot, with
an edited state or not, goes on from there.

The input names the user and sets up the world around the run:

    {"goal": "Get me ready for a weekend camping trip", "user": "ana",
     "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
     "cart_changes": [{"after_step": 2, "remove": "STOVE-1"}],  # the user edits the cart
     "shipping_timeouts": 2,    # the carrier's API times out on the first attempts
     "fail_payment": false,     # the card is declined
     "crash": "crash_after",    # a fault point on place_order (settings.AGENTRUN_FAULTS)
     "approval": true,          # an operator approves the payment (the default)
     "demo": "incident"}        # a label for the demo command

The incident this product is sold on: the agent reads the cart once, at
step 2, and works from memory.notes.cart after that. If the user removes an
item meanwhile, the agent still recommends (and reserves) an accessory for
it. Forking at the pre snapshot of step 3 with notes.cart corrected gives
the right recommendation.

The state contract keeps notes as strings, so structured notes (the cart,
the order lines...) are JSON text.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Any, TypeGuard

from agentrun.agents import (
    AgentError,
    Call,
    CallResult,
    Decision,
    InvalidInput,
    StateAgent,
    StepContext,
    register,
)
from agentrun.builtin.tools import ledger_write
from agentrun.models import InventoryItem, Run
from agentrun.state import AgentState
from agentrun.tools import RetryPolicy, ToolContext, ToolError, TransientToolError, tool

# --- the catalogue ------------------------------------------------------------------


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: Decimal
    weight_kg: Decimal
    tags: tuple[str, ...] = ()
    accessory: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"sku": self.sku, "name": self.name, "price": float(self.price)}


def _product(
    sku: str, name: str, price: str, weight: str, tags: str = "", accessory: str = ""
) -> Product:
    return Product(
        sku, name, Decimal(price), Decimal(weight), tuple(tags.split()), accessory or None
    )


CATALOGUE: dict[str, Product] = {
    p.sku: p
    for p in (
        _product(
            "TENT-2P", "Two-person tent", "189.00", "2.10", "camping tent shelter", "STAKES-AL"
        ),
        _product(
            "STOVE-1", "Backpacking stove", "59.90", "0.40", "camping cooking stove", "GAS-230"
        ),
        _product(
            "BAG-3S", "Three-season sleeping bag", "129.00", "1.30", "camping sleeping", "LINER-S"
        ),
        _product("LAMP-H", "Head torch", "34.00", "0.10", "camping hiking light", "BATT-AAA"),
        _product("BOTTLE-1L", "Water bottle 1 L", "18.00", "0.20", "hiking water", "FILTER-S"),
        _product("STAKES-AL", "Aluminium tent stakes, pack of 8", "14.50", "0.15", "camping tent"),
        _product("GAS-230", "Gas canister 230 g", "6.90", "0.38", "camping cooking"),
        _product("LINER-S", "Silk sleeping-bag liner", "39.00", "0.12", "camping sleeping"),
        _product("BATT-AAA", "AAA batteries, pack of 4", "5.20", "0.05", "light"),
        _product("FILTER-S", "Squeeze water filter", "29.00", "0.09", "hiking water"),
    )
}

CURRENCY = "EUR"
CENT = Decimal("0.01")


def _money(value: Any) -> Decimal:
    return Decimal(str(value)).quantize(CENT, rounding=ROUND_HALF_UP)


def _known(sku: Any) -> Product:
    if not isinstance(sku, str) or sku not in CATALOGUE:
        raise ToolError(f"unknown SKU {sku!r}")
    return CATALOGUE[sku]


# --- the world around a run ------------------------------------------------------------
# The demo's world (the user's cart, what the user does mid-run, the carrier's and the
# bank's moods) is described by the run input; tools look it up by run id, as a real
# tool would ask a real service. Forks carry their parent's input, hence its world.


def _world(ctx: ToolContext) -> dict[str, Any]:
    run = Run.objects.filter(pk=ctx.run_id).only("input").first()
    return run.input if run is not None and isinstance(run.input, dict) else {}


def cart_as_of(world: dict[str, Any], step: int) -> list[dict[str, Any]]:
    """The user's cart as a step sees it: the input cart minus changes made before it."""
    removed = {
        change["remove"]
        for change in world.get("cart_changes") or ()
        if step > change["after_step"]
    }
    return [
        {**CATALOGUE[line["sku"]].as_dict(), "qty": line["qty"]}
        for line in world.get("cart") or ()
        if line["sku"] not in removed
    ]


# --- tools ------------------------------------------------------------------------------

_SKUS_SCHEMA = {"type": "array", "items": {"type": "string"}}


@tool(
    kind="read",
    timeout=0,
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
)
def search_products(ctx: ToolContext, query: str, limit: int = 5) -> dict[str, Any]:
    """Products whose name or tags match words of `query`, best matches first."""
    words = set(re.findall(r"[a-z0-9]+", str(query).lower()))
    scored = []
    for p in CATALOGUE.values():
        score = len(words & (set(p.tags) | set(re.findall(r"[a-z0-9]+", p.name.lower()))))
        if score:
            scored.append((-score, p.sku, p))
    return {"query": query, "results": [p.as_dict() for _, _, p in sorted(scored)[: max(limit, 0)]]}


@tool(
    kind="read",
    timeout=0,
    parameters={"type": "object", "properties": {"user": {"type": "string"}}, "required": ["user"]},
)
def get_cart(ctx: ToolContext, user: str) -> dict[str, Any]:
    """The user's cart as it is now (at this step of the run)."""
    world = _world(ctx)
    items = cart_as_of(world, ctx.step) if user == world.get("user") else []
    return {"user": user, "as_of_step": ctx.step, "items": items}


@tool(
    kind="read",
    timeout=0,
    parameters={"type": "object", "properties": {"skus": _SKUS_SCHEMA}, "required": ["skus"]},
)
def get_recommendations(ctx: ToolContext, skus: list[str]) -> dict[str, Any]:
    """Accessories that go with the given products, in the order of `skus`."""
    products = [_known(sku) for sku in skus]
    recommendations = []
    for p in products:
        if p.accessory and p.accessory not in skus:
            acc = CATALOGUE[p.accessory]
            recommendations.append(
                {
                    **acc.as_dict(),
                    "for_sku": p.sku,
                    "for_name": p.name,
                    "reason": f"{acc.name} goes with the {p.name.lower()}",
                }
            )
    return {"for": list(skus), "recommendations": recommendations}


@tool(
    kind="read",
    timeout=0,
    parameters={"type": "object", "properties": {"skus": _SKUS_SCHEMA}, "required": ["skus"]},
)
def check_stock(ctx: ToolContext, skus: list[str]) -> dict[str, Any]:
    """Units available (on hand minus reserved) for each SKU."""
    for sku in skus:
        _known(sku)
    default = InventoryItem._meta.get_field("on_hand").get_default()
    held = {i.sku: i.on_hand - i.reserved for i in InventoryItem.objects.filter(sku__in=skus)}
    return {"stock": {sku: held.get(sku, default) for sku in skus}}


@tool(
    kind="read",
    timeout=0,
    retry=RetryPolicy(max_attempts=6, initial=0.3, factor=2.0, maximum=3.0),
    parameters={
        "type": "object",
        "properties": {"user": {"type": "string"}, "weight_kg": {"type": "number"}},
        "required": ["user", "weight_kg"],
    },
)
def shipping_quote(ctx: ToolContext, user: str, weight_kg: float) -> dict[str, Any]:
    """A quote from the carrier's API, which times out now and then (retried with backoff)."""
    timeouts = _world(ctx).get("shipping_timeouts", 0)
    if ctx.attempt <= timeouts:
        raise TransientToolError(
            f"carrier API timed out after 10 s (attempt {ctx.attempt}; "
            f"it times out {timeouts} time(s))"
        )
    started_kg = int(_money(weight_kg).to_integral_value(rounding=ROUND_CEILING))
    price = Decimal("4.90") + Decimal("1.50") * max(started_kg, 1)
    return {
        "carrier": "ParcelCo",
        "service": "standard",
        "price": float(price),
        "currency": CURRENCY,
        "days": 2,
        "weight_kg": weight_kg,
    }


@tool(
    kind="write",
    idempotent=True,
    timeout=0,
    parameters={
        "type": "object",
        "properties": {
            "user": {"type": "string"},
            "amount": {"type": "number"},
            "currency": {"type": "string"},
        },
        "required": ["user", "amount"],
    },
)
def charge_payment(
    ctx: ToolContext, user: str, amount: float, currency: str = CURRENCY
) -> dict[str, Any]:
    """Charge the user's card: one ledger row per idempotency key. A declined card is final."""
    if _world(ctx).get("fail_payment"):
        raise ToolError(
            f"card declined for {user}: do not honour (the bank refused {amount} {currency})"
        )
    entry = ledger_write(ctx, {"account": f"payments:{user}", "amount": amount})
    return {**entry, "currency": currency}


@tool(
    kind="write",
    idempotent=True,
    timeout=0,
    parameters={
        "type": "object",
        "properties": {
            "user": {"type": "string"},
            "total": {"type": "number"},
            "lines": {"type": "array", "items": {"type": "object"}},
            "payment_entry": {"type": "integer"},
        },
        "required": ["user", "lines", "total"],
    },
)
def place_order(
    ctx: ToolContext,
    user: str,
    lines: list[dict[str, Any]],
    total: float,
    payment_entry: int | None = None,
) -> dict[str, Any]:
    """Place the order in the order book (the ledger's `orders:` accounts), once per key."""
    if not lines:
        raise ToolError("an order needs at least one line")
    for line in lines:
        _known(line.get("sku") if isinstance(line, dict) else None)
    order_id = "ORD-" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:8].upper()
    entry = ledger_write(ctx, {"account": f"orders:{user}", "amount": total})
    return {
        "order_id": order_id,
        "lines": len(lines),
        "total": total,
        "payment_entry": payment_entry,
        "entry": entry["entry"],
        "duplicate": entry["duplicate"],
    }


# --- the policy -------------------------------------------------------------------------

STAGES = (
    "search",
    "cart",
    "recommend",
    "stock",
    "reserve",
    "shipping",
    "payment",
    "order",
    "email",
    "answer",
)
STAGE_TOOLS = {
    "search": "search_products",
    "cart": "get_cart",
    "recommend": "get_recommendations",
    "stock": "check_stock",
    "reserve": "reserve",
    "shipping": "shipping_quote",
    "payment": "charge_payment",
    "order": "place_order",
    "email": "notify",
}
TOOL_STAGES = {name: stage for stage, name in STAGE_TOOLS.items()}
#: The step of each stage when nothing ends the run early.
STAGE_STEPS = {stage: number for number, stage in enumerate(STAGES, start=1)}

INPUT_KEYS = (
    "goal",
    "user",
    "cart",
    "cart_changes",
    "shipping_timeouts",
    "fail_payment",
    "crash",
    "approval",
    "demo",
)
FAULTS = ("crash_before", "crash_after")
MAX_SHIPPING_TIMEOUTS = 5
MAX_CART_LINES = 20
MAX_QTY = 99
#: What a sandbox fork skips, by stage, as the final answer names it.
SKIPPED_NAMES = {
    "reserve": "the reservation",
    "payment": "the payment",
    "order": "the order",
    "email": "the e-mail",
}
#: Notes holding JSON text (the state keeps notes as strings).
JSON_NOTES = (
    "skipped",
    "search",
    "cart",
    "recommendation",
    "stock",
    "order_lines",
    "reservations",
    "shipping",
    "payment",
    "order",
    "email",
)


def next_stage(memory: dict[str, Any]) -> str:
    """The first stage not completed yet."""
    done = set(memory.get("completed") or ())
    return next((stage for stage in STAGES if stage not in done), "answer")


def read_note(notes: dict[str, Any], key: str, default: Any = None) -> Any:
    """A structured note: JSON text (or already a JSON value, if the state allows it)."""
    value = notes.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"memory.notes.{key} is not valid JSON: {exc}") from None


def write_note(notes: dict[str, Any], key: str, value: Any) -> None:
    notes[key] = json.dumps(value, ensure_ascii=False)


def read_lines(notes: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """Order lines from a note, checked: an operator may have edited them."""
    lines = read_note(notes, key, [])
    if not isinstance(lines, list):
        raise ValueError(f"memory.notes.{key} must be a JSON list of {{sku, qty}} objects")
    out = []
    for i, line in enumerate(lines):
        where = f"memory.notes.{key}[{i}]"
        if not isinstance(line, dict):
            raise ValueError(f"{where} must be an object with sku and qty")
        sku, qty = line.get("sku"), line.get("qty", 1)
        if sku not in CATALOGUE:
            raise ValueError(f"{where}.sku: unknown SKU {sku!r}")
        if not _is_count(qty) or qty < 1:
            raise ValueError(f"{where}.qty must be a positive integer, got {qty!r}")
        out.append({**CATALOGUE[sku].as_dict(), "qty": qty})
    return out


def describe(lines: list[dict[str, Any]]) -> str:
    return (
        ", ".join(f"{line['qty']} x {line['name']} ({line['sku']})" for line in lines) or "nothing"
    )


def subtotal(lines: list[dict[str, Any]]) -> Decimal:
    return sum((_money(line["price"]) * line["qty"] for line in lines), Decimal("0.00"))


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _email(user: str) -> str:
    return user if "@" in user else f"{user}@example.com"


@register
class ShopAgent(StateAgent):
    """Shops for a user with a fixed, explainable policy; see the module docstring."""

    name = "shop"
    description = (
        "The demo shop assistant: deterministic, no LLM; reproduces the stale-cart incident."
    )
    tools = tuple(STAGE_TOOLS.values())
    system_prompt = (
        "You are the shop assistant. Find what the user needs, build the order from their cart, "
        "recommend one accessory, reserve stock, get shipping, take payment (an operator "
        "approves it), place the order and e-mail the user."
    )

    # --- input and state -------------------------------------------------------------

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        unknown = sorted(set(input) - set(INPUT_KEYS))
        if unknown:
            raise InvalidInput(
                f"unknown key(s) {', '.join(unknown)} (known: {', '.join(INPUT_KEYS)})"
            )
        for key in ("goal", "user"):
            if not isinstance(input.get(key), str) or not input[key].strip():
                raise InvalidInput(f"{key} must be a non-empty string, got {input.get(key)!r}")
        skus = _check_cart(input.get("cart"))
        _check_cart_changes(input.get("cart_changes", []), skus)
        timeouts = input.get("shipping_timeouts", 0)
        if not _is_count(timeouts) or not 0 <= timeouts <= MAX_SHIPPING_TIMEOUTS:
            raise InvalidInput(
                f"shipping_timeouts must be an integer from 0 to {MAX_SHIPPING_TIMEOUTS}, "
                f"got {timeouts!r}"
            )
        for key in ("fail_payment", "approval"):
            if key in input and not isinstance(input[key], bool):
                raise InvalidInput(f"{key} must be true or false, got {input[key]!r}")
        if input.get("crash") not in (None, *FAULTS):
            raise InvalidInput(
                f"crash must be one of {', '.join(FAULTS)} or null, got {input['crash']!r}"
            )
        if "demo" in input and not isinstance(input["demo"], str):
            raise InvalidInput(f"demo must be a string, got {input['demo']!r}")

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        state = super().initial_state(input)
        state["memory"]["plan"] = list(STAGES)
        return state

    def validate_state(self, state: Any) -> None:
        st = AgentState.from_dict(state)
        notes = st.memory["notes"]
        for key in JSON_NOTES:
            read_note(notes, key)
        for key in ("cart", "order_lines"):
            read_lines(notes, key)

    # --- decide ------------------------------------------------------------------------

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        st = self.load(state)
        stage = next_stage(st.memory)
        try:
            return getattr(self, f"_decide_{stage}")(st.memory["notes"], st.memory, ctx.input)
        except ValueError as exc:  # a hand-edited note that doesn't parse
            raise AgentError(f"cannot decide the {stage!r} stage: {exc}") from exc

    def _decide_search(self, notes: dict, memory: dict, input: dict) -> Decision:
        goal = memory.get("goal") or input["goal"]
        return Decision(
            thought=f"Searching the catalogue for {goal!r}.",
            rationale="Start from what the shop sells for this goal.",
            calls=[Call("search_products", {"query": goal})],
        )

    def _decide_cart(self, notes: dict, memory: dict, input: dict) -> Decision:
        user = input["user"]
        return Decision(
            thought=f"Reading {user}'s cart.",
            rationale="The order is built from what is in the cart.",
            calls=[Call("get_cart", {"user": user})],
        )

    def _decide_recommend(self, notes: dict, memory: dict, input: dict) -> Decision:
        cart = read_lines(notes, "cart")
        if not cart:
            return self._answer("The cart is empty, so there is nothing to order.")
        return Decision(
            thought=f"Looking for an accessory to go with the cart: {describe(cart)}.",
            rationale=f"Based on the cart in memory (memory.notes.cart, read at step "
            f"{notes.get('cart_read_at_step', '?')}).",
            calls=[Call("get_recommendations", {"skus": [line["sku"] for line in cart]})],
        )

    def _decide_stock(self, notes: dict, memory: dict, input: dict) -> Decision:
        cart = read_lines(notes, "cart")
        rec = read_note(notes, "recommendation")
        skus = [line["sku"] for line in cart] + ([rec["sku"]] if rec else [])
        if rec:
            thought = (
                f"Recommending {rec['name']} ({rec['sku']}) because the cart has "
                f"{rec['for_name']} ({rec['for_sku']}). Checking stock for {', '.join(skus)}."
            )
        else:
            thought = f"No accessory to recommend. Checking stock for {', '.join(skus)}."
        return Decision(
            thought=thought,
            rationale="Only items in stock are reserved and ordered.",
            calls=[Call("check_stock", {"skus": skus})],
        )

    def _decide_reserve(self, notes: dict, memory: dict, input: dict) -> Decision:
        lines = read_lines(notes, "order_lines")
        if not lines:
            return self._answer("None of the items is in stock, so nothing was ordered.")
        return Decision(
            thought=f"Reserving {describe(lines)}.",
            rationale="Hold the stock before taking payment; "
            "it is released if the run fails or is cancelled.",
            calls=[Call("reserve", {"sku": line["sku"], "qty": line["qty"]}) for line in lines],
        )

    def _decide_shipping(self, notes: dict, memory: dict, input: dict) -> Decision:
        lines = read_lines(notes, "order_lines")
        weight = sum(CATALOGUE[line["sku"]].weight_kg * line["qty"] for line in lines)
        return Decision(
            thought=f"Asking the carrier for a shipping quote for {weight} kg.",
            rationale="The carrier's API is slow at times; timeouts are retried with backoff.",
            calls=[Call("shipping_quote", {"user": input["user"], "weight_kg": float(weight)})],
        )

    def _decide_payment(self, notes: dict, memory: dict, input: dict) -> Decision:
        lines = read_lines(notes, "order_lines")
        shipping = _money((read_note(notes, "shipping") or {}).get("price", 0))
        total = subtotal(lines) + shipping
        approval = input.get("approval", True)
        return Decision(
            thought=f"Charging {total} {CURRENCY} to {input['user']}'s card: {subtotal(lines)} for "
            f"{describe(lines)} plus {shipping} shipping.",
            rationale="An operator approves every payment."
            if approval
            else "Payment approval is off for this run.",
            calls=[
                Call(
                    "charge_payment",
                    {"user": input["user"], "amount": float(total), "currency": CURRENCY},
                    approval=approval,
                )
            ],
        )

    def _decide_order(self, notes: dict, memory: dict, input: dict) -> Decision:
        lines = read_lines(notes, "order_lines")
        payment = read_note(notes, "payment") or {}
        total = _money(notes.get("total") or subtotal(lines))
        args = {
            "user": input["user"],
            "lines": [{"sku": line["sku"], "qty": line["qty"]} for line in lines],
            "total": float(total),
            "payment_entry": payment.get("entry"),
        }
        return Decision(
            thought=f"Placing the order for {describe(lines)}, {total} {CURRENCY} paid "
            f"(ledger entry {payment.get('entry')}).",
            rationale="The order service honours the idempotency key: "
            "a retried call places one order.",
            calls=[Call("place_order", args, fault=input.get("crash"))],
        )

    def _decide_email(self, notes: dict, memory: dict, input: dict) -> Decision:
        to = _email(input["user"])
        return Decision(
            thought=f"E-mailing the order confirmation to {to}.",
            rationale="The user hears from us once the order is placed.",
            calls=[Call("notify", {"to": to, "body": self._summary(notes, input["user"])})],
        )

    def _decide_answer(self, notes: dict, memory: dict, input: dict) -> Decision:
        return self._answer(self._summary(notes, input["user"]))

    def _answer(self, text: str) -> Decision:
        return Decision(
            thought="Reporting back to the user.", rationale="Nothing left to do.", final=text
        )

    def _summary(self, notes: dict, user: str) -> str:
        lines = read_lines(notes, "order_lines")
        order = read_note(notes, "order") or {}
        shipping = read_note(notes, "shipping") or {}
        rec = read_note(notes, "recommendation")
        skipped = read_note(notes, "skipped") or []
        cost = (
            f"{notes.get('total', '?')} {CURRENCY} including "
            f"{_money(shipping.get('price', 0))} shipping "
            f"by {shipping.get('carrier', '?')} in {shipping.get('days', '?')} days."
        )
        if "order" in skipped:
            # A sandbox fork (or a recorded one past its divergence) runs no write tool:
            # any order id in the notes is the parent's, not one this run placed.
            names = [SKIPPED_NAMES[stage] for stage in STAGES if stage in skipped]
            text = (
                f"The order was not placed: this fork runs in sandbox mode, which skips "
                f"write tools, so {_and(names)} {'was' if len(names) == 1 else 'were'} skipped. "
                f"It would have ordered "
                f"{describe(lines)} for {user}: {cost}"
            )
        else:
            text = (
                f"Ordered {describe(lines)} for {user} (order {order.get('order_id', '?')}): {cost}"
            )
        if rec:
            text += f" Recommended {rec['name']} to go with the {rec['for_name'].lower()}."
        return text

    # --- observe: fold tool results into memory ------------------------------------------

    def observe(
        self, st: AgentState, decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> None:
        if decision.final is not None:
            st.memory["completed"].append("answer")
            return
        if not results:
            return
        stage = TOOL_STAGES[results[0].tool]
        notes = st.memory["notes"]
        getattr(self, f"_observe_{stage}")(notes, results, ctx)
        if any(r.status == "skipped" for r in results):
            write_note(notes, "skipped", [*(read_note(notes, "skipped") or []), stage])
        st.memory["completed"].append(stage)

    def _observe_search(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(notes, "search", (results[0].result or {}).get("results", []))

    def _observe_cart(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        items = (results[0].result or {}).get("items", [])
        write_note(
            notes,
            "cart",
            [{k: item.get(k) for k in ("sku", "name", "qty", "price")} for item in items],
        )
        notes["cart_read_at_step"] = str(ctx.step)

    def _observe_recommend(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        recs = (results[0].result or {}).get("recommendations", [])
        write_note(notes, "recommendation", recs[0] if recs else None)

    def _observe_stock(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        stock = (results[0].result or {}).get("stock", {})
        rec = read_note(notes, "recommendation")
        wanted = read_lines(notes, "cart") + ([{**rec, "qty": 1}] if rec else [])
        lines = [
            {k: line[k] for k in ("sku", "name", "qty", "price")}
            for line in wanted
            if stock.get(line["sku"], 0) >= line["qty"]
        ]
        write_note(notes, "stock", stock)
        write_note(notes, "order_lines", lines)

    def _observe_reserve(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(
            notes,
            "reservations",
            [
                {
                    "sku": r.args.get("sku"),
                    "qty": r.args.get("qty"),
                    "reservation": (r.result or {}).get("reservation"),
                }
                for r in results
            ],
        )

    def _observe_shipping(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(
            notes, "shipping", {**(results[0].result or {}), "attempts": results[0].attempts}
        )

    def _observe_payment(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(notes, "payment", results[0].result or {})
        notes["total"] = str(_money(results[0].args.get("amount", 0)))

    def _observe_order(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(notes, "order", results[0].result or {})

    def _observe_email(self, notes: dict, results: list[CallResult], ctx: StepContext) -> None:
        write_note(notes, "email", results[0].result or {})


# --- input checks ---------------------------------------------------------------------------


def _check_cart(cart: Any) -> list[str]:
    if not isinstance(cart, list) or not cart:
        raise InvalidInput("cart must be a non-empty list of {sku, qty} objects")
    if len(cart) > MAX_CART_LINES:
        raise InvalidInput(f"cart: at most {MAX_CART_LINES} lines, got {len(cart)}")
    skus: list[str] = []
    for i, line in enumerate(cart):
        where = f"cart[{i}]"
        if not isinstance(line, dict):
            raise InvalidInput(f"{where} must be an object with sku and qty")
        unknown = sorted(set(line) - {"sku", "qty"})
        if unknown:
            raise InvalidInput(f"{where}: unknown key(s) {', '.join(unknown)} (known: sku, qty)")
        sku, qty = line.get("sku"), line.get("qty")
        if sku not in CATALOGUE:
            raise InvalidInput(f"{where}.sku: unknown SKU {sku!r} (known: {', '.join(CATALOGUE)})")
        if sku in skus:
            raise InvalidInput(
                f"{where}.sku: {sku} is already in the cart (cart[{skus.index(sku)}])"
            )
        if not _is_count(qty) or not 1 <= qty <= MAX_QTY:
            raise InvalidInput(f"{where}.qty must be an integer from 1 to {MAX_QTY}, got {qty!r}")
        skus.append(sku)
    return skus


def _check_cart_changes(changes: Any, skus: list[str]) -> None:
    if not isinstance(changes, list):
        raise InvalidInput("cart_changes must be a list of {after_step, remove} objects")
    for i, change in enumerate(changes):
        where = f"cart_changes[{i}]"
        if not isinstance(change, dict):
            raise InvalidInput(f"{where} must be an object with after_step and remove")
        unknown = sorted(set(change) - {"after_step", "remove"})
        if unknown:
            raise InvalidInput(
                f"{where}: unknown key(s) {', '.join(unknown)} (known: after_step, remove)"
            )
        step = change.get("after_step")
        if not _is_count(step) or step < 1:
            raise InvalidInput(f"{where}.after_step must be a positive integer, got {step!r}")
        if change.get("remove") not in skus:
            raise InvalidInput(
                f"{where}.remove: {change.get('remove')!r} is not in the cart "
                f"(cart has: {', '.join(skus)})"
            )
