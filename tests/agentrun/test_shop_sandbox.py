"""The shop agent's answer in a sandbox fork says the order was not placed, and why."""

import re

import pytest

from agentrun.lifecycle import services
from agentrun.management.commands.demo import corrected_state
from agentrun.models import LedgerEntry, OutboxMessage, ToolCall
from tests.base import drive, make_people

pytestmark = pytest.mark.django_db

INPUT = {
    "goal": "Get me ready for a weekend camping trip",
    "user": "ana",
    "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
    "cart_changes": [{"after_step": 2, "remove": "STOVE-1"}],
    "approval": False,
}


def incident():
    run = drive(services.start_run("shop", INPUT))
    assert run.status == "succeeded", run.error
    return run


def test_the_incident_fix_in_sandbox_says_the_order_was_not_placed_because_of_sandbox_mode():
    parent = incident()
    operator = make_people()["operator"]
    fork = services.fork_run(
        parent, step=3, at="pre", state=corrected_state(parent, 3), mode="sandbox", user=operator
    )

    fork = drive(fork)

    assert fork.status == "succeeded", fork.error
    answer = fork.final_answer
    assert answer.startswith("The order was not placed: this fork runs in sandbox mode")
    assert "so the reservation, the payment, the order and the e-mail were skipped." in answer, (
        answer
    )
    assert "It would have ordered 1 x Two-person tent (TENT-2P)" in answer
    assert "?" not in answer
    # It is true: nothing was written for the fork.
    assert set(
        ToolCall.objects.filter(run=fork, kind__in=("write", "hybrid")).values_list(
            "status", flat=True
        )
    ) == {"skipped"}
    assert not LedgerEntry.objects.filter(run=fork).exists()
    assert not OutboxMessage.objects.filter(run=fork).exists()
    # The parent, which ran for real, still reports its order.
    assert re.match(r"Ordered .* \(order ORD-[0-9A-F]{8}\): ", parent.final_answer)


def test_a_sandbox_fork_reusing_the_parents_order_result_does_not_claim_that_order():
    parent = incident()
    order_id = re.search(r"ORD-[0-9A-F]{8}", parent.final_answer).group()

    # Unedited, from just before the order: the skipped call gets the parent's result.
    fork = drive(services.fork_run(parent, step=8, at="pre", mode="sandbox"))

    assert fork.status == "succeeded", fork.error
    skipped = ToolCall.objects.get(run=fork, tool="place_order")
    assert skipped.status == "skipped" and skipped.result["order_id"] == order_id
    assert fork.final_answer.startswith("The order was not placed: this fork runs in sandbox mode")
    assert "write tools, so the order and the e-mail were skipped." in fork.final_answer
    assert order_id not in fork.final_answer
    # The e-mail, written before its own call was skipped, says the same of the order alone.
    email = ToolCall.objects.get(run=fork, tool="notify")
    assert email.status == "skipped"
    assert "write tools, so the order was skipped. It would have" in email.args["body"]
