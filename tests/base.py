"""Named people and small helpers shared by the tests."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from agentrun import engine
from agentrun.lifecycle import services
from agentrun.models import Run
from agentrun.security.roles import create_user

PASSWORD = "correct horse battery"


def make_people() -> dict[str, Any]:
    """An operator (Olga), a viewer (Victor), an admin (Ada) and an outsider with no role (Oscar)."""
    from django.contrib.auth import get_user_model

    outsider, _ = get_user_model().objects.get_or_create(username="oscar")
    outsider.set_password(PASSWORD)
    outsider.save()
    return {
        "operator": create_user("olga", "operator", PASSWORD),
        "viewer": create_user("victor", "viewer", PASSWORD),
        "admin": create_user("ada", "admin", PASSWORD),
        "outsider": outsider,
    }


def script(*steps: dict[str, Any], goal: str = "test goal") -> dict[str, Any]:
    return {"goal": goal, "steps": list(steps)}


def calls(*calls: dict[str, Any], thought: str = "act") -> dict[str, Any]:
    return {"thought": thought, "calls": list(calls)}


def final(answer: str = "done", thought: str = "finish") -> dict[str, Any]:
    return {"thought": thought, "final": answer}


def make_run(input: dict[str, Any] | None = None, agent: str = "scripted", user: Any = None) -> Run:
    return services.start_run(
        agent, input or script(calls({"tool": "echo", "args": {"x": 1}}), final()), user=user
    )


def drive(run: Run, max_steps: int = 100, through_backoff: bool = False) -> Run:
    """Execute a run's steps in this process until it stops moving (no worker, no broker).

    With through_backoff, a run parked for a retry is waited for and resumed.
    """
    for _ in range(max_steps):
        run.refresh_from_db()
        if (
            through_backoff
            and run.status == "waiting"
            and run.wait_reason == "backoff"
            and run.wake_at
        ):
            time.sleep(max((run.wake_at - timezone.now()).total_seconds(), 0) + 0.02)
        elif run.status not in ("queued", "running"):
            break
        outcome = engine.execute_step(run.pk, run.next_step)
        if outcome.status == "not_claimed":
            break
    run.refresh_from_db()
    return run


def make_in_flight(
    state: str,
    count: int = 1,
    *,
    waited: float = 5.0,
    worker: str = "host-a:101",
    tools: tuple[str, ...] = ("echo",),
    step: int = 2,
    wake_in: float = 3.0,
    now: Any = None,
) -> list[Run]:
    """`count` runs caught in one state of agentrun.engine.inflight, written straight to the tables
    (bulk inserts, as many as a test needs), each having waited `waited` seconds by `now`.

    deciding/acting/stalled runs are leased by `worker` (a fresh `:uuid8` each); acting ones
    are inside their first call (an intent whose attempt started), backoff ones wait to
    retry it (`wake_in` seconds from now), approval and in_doubt ones are parked on it.
    """
    import uuid
    from datetime import timedelta

    from django.db.models import F

    from agentrun.models import Step, ToolCall

    now = now or timezone.now()
    since = now - timedelta(seconds=waited)
    leased = state in ("deciding", "acting", "stalled")
    decided = state not in ("deciding", "stalled", "queued")
    runs = [
        Run(
            agent="scripted",
            input={"goal": f"{state} {i}"},
            status={
                "backoff": "waiting",
                "approval": "waiting",
                "in_doubt": "waiting",
                "crashed": "waiting",
            }.get(state, "queued" if state == "queued" else "running"),
            wait_reason=state if state in ("backoff", "approval", "in_doubt", "crashed") else "",
            next_step=1 if state == "queued" else step,
            lease_owner=f"{worker}:{uuid.uuid4().hex[:8]}" if leased else "",
            # A live worker's lease stays ahead however long the test takes.
            lease_expires_at=(since if state == "stalled" else now + timedelta(hours=1))
            if leased
            else None,
            wake_at=now + timedelta(seconds=wake_in) if state == "backoff" else None,
            created_at=since,
            started_at=None if state == "queued" else since,
        )
        for i in range(count)
    ]
    Run.objects.bulk_create(runs)
    # updated_at is auto_now: the time the run last moved is what the page counts from.
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(updated_at=F("created_at"))
    if state == "queued":
        return runs
    steps = Step.objects.bulk_create(
        Step(
            run=run,
            number=step,
            status="waiting" if state in ("approval", "in_doubt") else "running",
            attempts=2 if state == "backoff" else 1,
            decision={"thought": "act", "calls": [{"tool": t, "args": {}} for t in tools]}
            if decided
            else None,
            decided_at=since if decided else None,
            started_at=since,
        )
        for run in runs
    )
    if not decided:
        return runs
    call_status = {"acting": "intent", "backoff": "planned", "approval": "awaiting_approval"}
    attempt: dict[str, Any] = {"at": since.isoformat(), "started": True}
    if state == "backoff":
        attempt.update(ended=True, error="ToolError: try later", backoff_s=wake_in)
    ToolCall.objects.bulk_create(
        ToolCall(
            run=run,
            step=s,
            index=0,
            tool=tools[0],
            kind="write",
            args_hash="0" * 64,
            idempotency_key=f"{run.pk}:{step}:0:{tools[0]}:0",
            status=call_status.get(state, "in_doubt"),
            error="ToolError: try later" if state == "backoff" else "",
            attempts=[] if state == "approval" else [attempt],
            requires_approval=state == "approval",
            created_at=since,
        )
        for run, s in zip(runs, steps, strict=True)
    )
    return runs


# The demo's incident (the stale-cart shop run): the user removed STOVE-1 after step 2, and
# the agent's copy of the cart (memory.notes.cart) never followed.
INCIDENT = {
    "goal": "Get me ready for a weekend camping trip",
    "user": "ben",
    "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
    "cart_changes": [{"after_step": 2, "remove": "STOVE-1"}],
    "approval": False,
}


def play_incident() -> Run:
    """The demo's incident, played in this process to its (wrongly) successful end."""
    from agentrun.lifecycle import services

    run = drive(services.start_run("shop", INCIDENT), through_backoff=True)
    assert run.status == "succeeded", run.error
    return run


def as_owner(statement: str, params: list | None = None) -> None:
    """Change the event log as its owner would, past the triggers that refuse it (on
    PostgreSQL the test database's superuser skips every trigger for that statement)."""
    from django.db import connection, transaction

    postgresql = connection.vendor == "postgresql"
    with transaction.atomic(), connection.cursor() as cursor:
        if postgresql:
            cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(statement, params or [])
        if postgresql:
            cursor.execute("SET LOCAL session_replication_role = origin")
