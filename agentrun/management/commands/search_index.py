"""Build the stored search index of long finished runs (agentrun.store.callsearch).

    manage.py search_index [RUN_ID ...] [--missing]

A worker builds a run's index when the run ends; this builds it for runs that ended
before the index existed, or were imported. With run ids: those runs (a run that
should have no index, short or active or purged, has any it had deleted). With
--missing: every finished, unpurged run of at least AGENTRUN_SEARCH_INDEX_STEPS steps
with no index of its calls as they are now.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import F

from agentrun.management.commands.fork import find_run
from agentrun.models import ACTIVE_STATUSES, Run
from agentrun.store import callsearch


class Command(BaseCommand):
    help = "Build the stored search index of long finished runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_ids", nargs="*")
        parser.add_argument(
            "--missing", action="store_true", help="every long finished run without one"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["run_ids"] and not options["missing"]:
            raise CommandError("give run ids, or --missing")
        runs = [find_run(r) for r in options["run_ids"]]
        if options["missing"]:
            least = settings.AGENTRUN_SEARCH_INDEX_STEPS
            if least <= 0:
                raise CommandError("AGENTRUN_SEARCH_INDEX_STEPS is 0: no run gets an index")
            long_ended = (
                Run.objects.exclude(status__in=ACTIVE_STATUSES)
                .filter(purged_at__isnull=True)
                .alias(length=F("next_step") - F("first_step"))
                .filter(length__gte=least)
            )
            runs += [
                run for run in long_ended.order_by("created_at") if not callsearch.has_index(run)
            ]
        for run in runs:
            started = time.perf_counter()
            blocks = callsearch.build(run.pk)
            ms = (time.perf_counter() - started) * 1000
            self.stdout.write(f"{run.pk}: {blocks} blocks in {ms:.0f} ms")
