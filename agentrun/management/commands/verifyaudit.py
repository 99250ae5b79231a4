"""Verify the event log's hash chains (agentrun.audit.chain).

    manage.py verifyaudit [--json]

Checks every stream (each run's, the operators'): each event's hash against its
fields, each link to the event before it, each stream's head, and each purge's summary
of the run chains it purged. Names the first broken link and exits 1; exits 0 when
every chain holds.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agentrun.audit import chain


class Command(BaseCommand):
    help = "Verify the audit trail's hash chains; name the first broken link (exit 1)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        report = chain.verify()
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
        elif report.broken is None:
            self.stdout.write(
                f"verified: {report.events} event(s) in {report.streams} stream(s), "
                f"{report.summaries} purged run chain(s) checked"
            )
        else:
            self.stderr.write(f"broken at {report.broken}")
        if report.broken is not None:
            raise SystemExit(1)
