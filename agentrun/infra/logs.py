"""Logging that stays quiet when nothing happens.

Beat sends the reconciler every AGENTRUN_RECONCILE_EVERY seconds (5 by default), and
Celery logs each pass three times at INFO (sent, received, succeeded): a terminal of
`make up` that scrolls by every few seconds while nothing happens hides the lines
that matter. Those routine lines are logged at DEBUG instead; the reconciler logs
one INFO line of its own when a pass did something (agentrun.engine.reconcile), and
Celery's warnings and errors about it keep their level.
"""

from __future__ import annotations

import logging

#: Celery's loggers that report every task sent, received and finished.
ROUTINE_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})
#: Tasks whose routine lines are DEBUG.
QUIET_TASKS = ("agentrun.reconcile",)


class QuietRoutineTasks(logging.Filter):
    """On a handler: Celery's INFO lines about a periodic task become DEBUG lines,
    shown only when the logger they come from is enabled for DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or record.name not in ROUTINE_LOGGERS:
            return True
        text = record.getMessage()
        if not any(task in text for task in QUIET_TASKS):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
