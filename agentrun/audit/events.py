"""The append-only event log: one helper to write to it."""

from __future__ import annotations

from typing import Any

from agentrun.models import Event, Run
from agentrun.security.redact import redact


def record_event(
    kind: str,
    *,
    run: Run | None = None,
    step: int | None = None,
    user: Any = None,
    actor: str | None = None,
    reason: str = "",
    payload: dict[str, Any] | None = None,
) -> Event:
    """Append one event. Operator actions pass `user`, which names the actor."""
    if actor is None:
        actor = user.get_username() if user is not None else "system"
    return Event.objects.create(
        run=run,
        step=step,
        kind=kind,
        actor=actor,
        user=user if user is not None else None,
        reason=reason,
        payload=redact(payload or {}),
    )
