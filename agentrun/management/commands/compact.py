"""Regroup the deltas of long finished runs (agentrun.store.compaction).

    manage.py compact [RUN_ID ...] [--all]

A worker regroups a run's deltas when the run ends; this does it for runs that ended
before compaction existed, or were imported. With run ids: those runs (one that should
not be, short or active or purged, is left as it is). With --all: every finished,
unpurged run of at least AGENTRUN_COMPACT_STEPS steps (a run regrouped already costs a
read of its rows' first bytes).
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import F

from agentrun.management.commands.fork import find_run
from agentrun.models import ACTIVE_STATUSES, Run
from agentrun.store import compaction


class Command(BaseCommand):
    help = "Regroup the deltas of long finished runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="*")
        parser.add_argument("--all", action="store_true", help="every long finished run")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["run_ids"] and not options["all"]:
            raise CommandError("give run ids, or --all")
        runs = [find_run(r) for r in options["run_ids"]]
        if options["all"]:
            least = settings.AGENTRUN_COMPACT_STEPS
            if least <= 0:
                raise CommandError("AGENTRUN_COMPACT_STEPS is 0: no run is regrouped")
            runs += list(
                Run.objects.exclude(status__in=ACTIVE_STATUSES)
                .filter(purged_at__isnull=True)
                .alias(length=F("next_step") - F("first_step"))
                .filter(length__gte=least)
                .order_by("created_at")
            )
        failed = 0
        for run in runs:
            started = time.perf_counter()
            try:
                deltas = compaction.compact(run.pk)
            except (
                Exception
            ) as exc:  # the next runs are still regrouped; this one is left as it was
                failed += 1
                self.stderr.write(f"{run.pk}: not regrouped: {exc}")
                continue
            ms = (time.perf_counter() - started) * 1000
            self.stdout.write(f"{run.pk}: {deltas} deltas regrouped in {ms:.0f} ms")
        if failed:
            raise CommandError(f"{failed} run(s) not regrouped")
