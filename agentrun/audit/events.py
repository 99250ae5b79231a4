"""The append-only event log: one helper to write to it."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from agentrun.models import Event, Run
from agentrun.security.redact import redact

# On PostgreSQL the chaining trigger takes the event's actor and user from these
# transaction settings, and its time from the database's clock (migration 0021).
_SET_ACTOR = (
    "SELECT set_config('agentrun.actor', %s, true), set_config('agentrun.user_id', %s, true)"
)


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
    """Append one event. Operator actions pass `user`, which names the actor.

    On PostgreSQL the actor and user are handed to the database for this insert only
    (transaction-local settings, cleared after it); the database stamps the time."""
    if actor is None:
        actor = user.get_username() if user is not None else "system"
    event = Event(
        run=run,
        step=step,
        kind=kind,
        actor=actor,
        user=user if user is not None else None,
        reason=reason,
        payload=redact(payload or {}),
    )
    if connection.vendor != "postgresql" or (actor == "system" and user is None):
        event.save(force_insert=True)
        return event
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SET_ACTOR, [actor, "" if user is None else str(user.pk)])
        event.save(force_insert=True)
        cursor.execute(_SET_ACTOR, ["", ""])
    return event
