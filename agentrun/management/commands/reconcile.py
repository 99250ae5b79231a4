"""`manage.py reconcile`: one pass of the reconciler (what Celery beat runs periodically)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from agentrun.engine.reconcile import reconcile_once


class Command(BaseCommand):
    help = "Re-enqueue runs whose wake-up was lost and compensate failed runs' hybrid calls, once."

    def handle(self, *args: Any, **options: Any) -> None:
        done = reconcile_once()
        self.stdout.write(
            f"enqueued {done['enqueued']} run(s), compensated {done['compensated']} call(s)"
        )
