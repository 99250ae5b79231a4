"""Named people and small helpers shared by the tests."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from agentrun import engine, services
from agentrun.models import Run
from agentrun.roles import create_user

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
