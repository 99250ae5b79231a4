"""Waking a worker for a step: the broker message is only a wake-up."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


def enqueue(run_id: Any, step: int, countdown: float | None = None) -> None:
    """Wake a worker for (run, step) once the current transaction commits.

    The message is only a wake-up: losing or duplicating it is harmless.
    """
    if not settings.AGENTRUN_ENQUEUE:
        return

    def send() -> None:
        from agentrun.tasks import execute_step_task

        try:
            execute_step_task.apply_async((str(run_id), step), countdown=countdown)
        except Exception:  # the reconciler will find the run
            log.exception("could not enqueue step %s of %s", step, run_id)

    transaction.on_commit(send)
