"""Pin a run so retention keeps it (with its fork ancestors and descendants), or unpin it.

    manage.py pin RUN_ID --reason "incident #123" --user NAME
    manage.py pin RUN_ID --unpin [--reason R] --user NAME

The pin is an operator's action: --user names an active operator or admin, and the
event that records it names them. Every error is a CommandError and changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.lifecycle import services
from agentrun.management.commands.fork import find_operator, find_run


class Command(BaseCommand):
    help = "Keep a run (and its fork lineage) from retention, with a reason; --unpin undoes it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--reason", default=None, help="why it is kept, e.g. incident #123")
        parser.add_argument("--unpin", action="store_true", help="let retention purge it again")
        parser.add_argument("--user", required=True, help="the operator or admin pinning it")

    def handle(self, *args: Any, **options: Any) -> None:
        run = find_run(options["run_id"])
        user = find_operator(options["user"], action="pinning")
        try:
            if options["unpin"]:
                services.unpin_run(run, user=user, reason=options["reason"] or "")
                self.stdout.write(f"unpinned {run.pk}")
                return
            if options["reason"] is None:
                raise CommandError('a pin needs a reason: --reason "incident #123"')
            run = services.pin_run(run, user=user, reason=options["reason"])
        except (services.PinError, services.ActionError) as exc:
            raise CommandError(f"run {run.pk}: {exc}") from None
        self.stdout.write(f"pinned {run.pk}: {run.pin_reason}")
