"""Purge finished runs' steps, snapshots and read calls (what beat does every hour).

    manage.py purge [--older-than 30d] [--dry-run] [--batch N]

Without --older-than the configured retention (AGENTRUN_RETENTION_DAYS) applies.
Pinned runs, their fork ancestors and descendants, active runs and the audit trail
(events, write/hybrid calls) stay: see agentrun.lifecycle.retention.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.lifecycle import retention


def positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise CommandError(f"--batch must be a whole number, not {value!r}") from None
    if not 1 <= number <= 100_000:
        raise CommandError(f"--batch must be between 1 and 100000, not {number}")
    return number


class Command(BaseCommand):
    help = "Delete finished runs' steps, snapshots and read calls past the retention period."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            default=None,
            help="finished more than this long ago: 30d, 12h, 90m (default: the retention)",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, change nothing")
        parser.add_argument("--batch", default=None, help="rows per DELETE statement")

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = None
        if options["older_than"] is not None:
            try:
                older_than = retention.parse_duration(options["older_than"])
            except ValueError as exc:
                raise CommandError(f"--older-than: {exc}") from None
        elif retention.retention() is None:
            raise CommandError(
                "retention is off (AGENTRUN_RETENTION_DAYS=0): give --older-than, e.g. 30d"
            )
        batch = positive(options["batch"]) if options["batch"] is not None else None
        report = retention.purge(older_than, dry_run=options["dry_run"], batch=batch)
        if report.runs and not report.dry_run:
            retention.record(report, actor="manage.py purge")
        verb = "would purge" if report.dry_run else "purged"
        self.stdout.write(
            f"{verb} {report.runs} run(s) finished before {report.cutoff:%Y-%m-%d %H:%M:%S %Z}: "
            f"{report.steps} step(s), {report.snapshots} snapshot(s), "
            f"{report.tool_calls} read call(s); kept {report.kept} for a pin or a fork "
            f"({report.seconds:.1f} s)"
        )
