"""A hybrid tool: it holds a seat, and its compensation releases the seat again when the
run fails or is cancelled. tests/test_docs.py runs it through the engine."""

from pathlib import Path
from typing import Any

from django.conf import settings

from agentrun.tools import RetryPolicy, ToolContext, ToolError, tool


def release_seat(ctx: ToolContext, args: dict[str, Any], result: Any) -> dict[str, Any]:
    """Undo hold_seat. Idempotent, as a compensation must be: a second call finds no hold."""
    hold = Path(result["hold"])
    held = hold.exists()
    hold.unlink(missing_ok=True)
    return {"released": held}


@tool(
    kind="hybrid",
    compensate=release_seat,
    idempotent=True,  # one hold per idempotency key: a retry holds no second seat
    timeout=10,
    retry=RetryPolicy(max_attempts=3, initial=1.0),
    parameters={
        "type": "object",
        "properties": {"flight": {"type": "string"}, "seat": {"type": "string"}},
        "required": ["flight", "seat"],
    },
)
def hold_seat(ctx: ToolContext, flight: str, seat: str) -> dict[str, Any]:
    """Hold a seat on a flight until the run ends."""
    if not seat.strip():
        raise ToolError("seat must not be blank")  # fails the call for good
    hold = Path(settings.VAR_DIR) / "holds" / (ctx.idempotency_key.replace(":", "_") + ".txt")
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.write_text(f"{flight} {seat}")
    return {"hold": str(hold), "flight": flight, "seat": seat}
