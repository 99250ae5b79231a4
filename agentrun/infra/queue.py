"""Messages to workers, sent once the current transaction commits.

The broker is only a wake-up: a message lost or sent twice is harmless, since the database
says what is due (the reconciler finds a run whose wake-up was lost). Tasks are named, not
imported, so that what sends one (the engine, the store's derived data) needs nothing above it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)


#: Workers of a code version consume this queue besides the default one.
VERSION_QUEUE_PREFIX = "agentrun.version."


def enqueue(run_id: Any, step: int, countdown: float | None = None, version: str = "") -> None:
    """Wake a worker for (run, step) once the current transaction commits: any worker, or
    one of `version` when the run asks for a code version."""
    if not settings.AGENTRUN_ENQUEUE:
        return
    options: dict[str, Any] = {"countdown": countdown}
    if version:
        options["queue"] = VERSION_QUEUE_PREFIX + version

    def send() -> None:
        try:
            current_app.send_task("agentrun.execute_step", (str(run_id), step), **options)
        except Exception:  # the reconciler will find the run
            log.exception("could not enqueue step %s of %s", step, run_id)

    transaction.on_commit(send)


def ask(task_name: str, run_id: Any, what: str) -> None:
    """Send a worker the task `task_name` for a run once the current transaction commits
    (a run's derived data: its search index, its deltas regrouped). A message that can't be
    sent is logged: what it asks for can be done again (`what` says what it was)."""
    if not settings.AGENTRUN_ENQUEUE:
        return

    def send() -> None:
        try:
            current_app.send_task(task_name, (str(run_id),))
        except Exception:
            log.exception("could not ask for %s of %s", what, run_id)

    transaction.on_commit(send)
