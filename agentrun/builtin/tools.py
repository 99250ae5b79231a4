"""Built-in test tools: any behaviour (slow, flaky, failing, side-effecting)
can be produced with them, without an LLM."""

from __future__ import annotations

import time
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agentrun.models import InventoryItem, LedgerEntry, LedgerInvocation, OutboxMessage, Reservation
from agentrun.tools import RetryPolicy, ToolContext, ToolError, TransientToolError, tool


@tool(kind="read", timeout=0, parameters={"type": "object", "additionalProperties": True})
def echo(ctx: ToolContext, **args: Any) -> dict[str, Any]:
    """Return the arguments verbatim."""
    return args


@tool(
    kind="read",
    timeout=660,
    parameters={"type": "object", "properties": {"seconds": {"type": "number"}}},
)
def sleep(ctx: ToolContext, seconds: float = 1.0) -> dict[str, Any]:
    """Sleep for `seconds` (at most 600) and return how long it slept."""
    if (
        not isinstance(seconds, (int, float))
        or isinstance(seconds, bool)
        or not 0 <= seconds <= 600
    ):
        raise ToolError("seconds must be a number between 0 and 600")
    time.sleep(seconds)
    return {"slept": seconds}


@tool(
    kind="read",
    retry=RetryPolicy(max_attempts=6, initial=0.2, maximum=5.0),
    parameters={"type": "object", "properties": {"failures": {"type": "integer"}}},
)
def flaky(ctx: ToolContext, failures: int = 1, **payload: Any) -> dict[str, Any]:
    """Fail with a transient error on the first `failures` attempts, then succeed."""
    if ctx.attempt <= failures:
        raise TransientToolError(
            f"flaky: simulated timeout on attempt {ctx.attempt} of {failures + 1}"
        )
    return {"ok": True, "attempt": ctx.attempt, **payload}


@tool(
    kind="read",
    timeout=0,
    parameters={"type": "object", "properties": {"message": {"type": "string"}}},
)
def fail(ctx: ToolContext, message: str = "permanent failure") -> None:
    """Always fail with a permanent (not retried) error."""
    raise ToolError(message)


def _amount(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ToolError("amount must be a number")
    try:
        return Decimal(str(value))
    except InvalidOperation:
        raise ToolError("amount must be a number") from None


@tool(
    kind="write",
    idempotent=True,
    timeout=0,
    parameters={
        "type": "object",
        "properties": {"account": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["account", "amount"],
    },
)
def ledger_write(ctx: ToolContext, account: str, amount: float) -> dict[str, Any]:
    """Append one ledger row per idempotency key; every invocation is counted."""
    value = _amount(amount)
    with transaction.atomic():
        inv, _ = LedgerInvocation.objects.get_or_create(
            idempotency_key=ctx.idempotency_key, defaults={"run_id": ctx.run_id}
        )
        LedgerInvocation.objects.filter(pk=inv.pk).update(count=F("count") + 1)
        entry, created = LedgerEntry.objects.get_or_create(
            idempotency_key=ctx.idempotency_key,
            defaults={"run_id": ctx.run_id, "account": str(account), "amount": value},
        )
    return {
        "entry": entry.pk,
        "account": entry.account,
        "amount": str(entry.amount),
        "duplicate": not created,
    }


@tool(
    kind="write",
    idempotent=False,
    timeout=0,
    parameters={
        "type": "object",
        "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
    },
)
def notify(ctx: ToolContext, to: str = "", body: str = "", **extra: Any) -> dict[str, Any]:
    """Send a message (append it to the outbox). Not idempotent: every call sends."""
    msg = OutboxMessage.objects.create(
        run_id=ctx.run_id, idempotency_key=ctx.idempotency_key, to=str(to), body=str(body)
    )
    return {"message": msg.pk, "to": msg.to}


def release(ctx: ToolContext, args: dict[str, Any], result: Any) -> dict[str, Any]:
    """Compensation of `reserve`: give the held inventory back (idempotent)."""
    key = ctx.idempotency_key.removesuffix(":compensate")
    with transaction.atomic():
        held = (
            Reservation.objects.select_for_update()
            .filter(idempotency_key=key, released=False)
            .first()
        )
        if held is None:
            return {"released": 0}
        held.released, held.released_at = True, timezone.now()
        held.save(update_fields=["released", "released_at"])
        InventoryItem.objects.filter(sku=held.sku).update(reserved=F("reserved") - held.qty)
    return {"released": held.qty, "sku": held.sku}


@tool(
    kind="hybrid",
    idempotent=True,
    compensate=release,
    timeout=0,
    parameters={
        "type": "object",
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
        "required": ["sku", "qty"],
    },
)
def reserve(ctx: ToolContext, sku: str, qty: int) -> dict[str, Any]:
    """Hold `qty` units of `sku`; undone by `release` on cancel or failure."""
    if isinstance(qty, bool) or not isinstance(qty, int) or qty <= 0:
        raise ToolError("qty must be a positive integer")
    with transaction.atomic():
        held, created = Reservation.objects.get_or_create(
            idempotency_key=ctx.idempotency_key,
            defaults={"run_id": ctx.run_id, "sku": str(sku), "qty": qty},
        )
        if created:
            item, _ = InventoryItem.objects.get_or_create(sku=str(sku))
            InventoryItem.objects.filter(pk=item.pk).update(reserved=F("reserved") + qty)
    return {"reservation": held.pk, "sku": held.sku, "qty": held.qty}
