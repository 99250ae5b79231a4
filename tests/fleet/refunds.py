"""The `refunds` agent: looks an order up, computes a refund, pays it once, answers.

The policy that computes the refund is the part that changes between the two versions
(refunds_v1: it divides by the number of items, and fails on an order with none;
refunds_v2: it doesn't). Both register the same agent name, as a redeploy would.
"""

from __future__ import annotations

from typing import Any

from agentrun.agents import AgentError, Call, CallResult, Decision, StateAgent, StepContext
from agentrun.state import AgentState


class Refunds(StateAgent):
    name = "refunds"
    description = "Looks an order up, pays its refund once, answers."
    tools = ("echo", "ledger_write")
    per_item = True  # v1's bug: an order with no items divides by zero

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        notes, order = self.load(state).memory["notes"], ctx.input["order"]
        if "order" not in notes:
            return Decision(thought="Look the order up.", calls=[Call("echo", order)])
        if "paid" not in notes:
            return Decision(
                thought="Pay the refund.",
                calls=[
                    Call("ledger_write", {"account": order["id"], "amount": self.refund(order)})
                ],
            )
        return Decision(thought="Done.", final=f"refunded {order['id']}")

    def refund(self, order: dict[str, Any]) -> float:
        if self.per_item:
            try:
                return order["total"] / len(order["items"]) * len(order["items"])
            except ZeroDivisionError:
                raise AgentError("refund: division by zero (an order with no items)") from None
        return float(order["total"])

    def observe(
        self, st: AgentState, decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> None:
        for r in results:
            if r.tool == "echo":
                st.memory["notes"]["order"] = str(r.result.get("id"))
            else:  # a sandbox fork skips the write: its result is then null
                st.memory["notes"]["paid"] = str((r.result or {}).get("entry", r.status))


def order(n: int, items: int = 1) -> dict[str, Any]:
    return {"order": {"id": f"order-{n}", "total": 10.0 + n, "items": ["x"] * items}}
