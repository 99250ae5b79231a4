"""Replay incidents' archives on the current code, in a throwaway database; fail on a regression.

    manage.py replaytest ARCHIVE... [--expect fixed] [--from before-failure|start|tool:T|step:N]

Creates a test database (as Django's test runner does: `test_<name>` on PostgreSQL, in
memory on SQLite), imports each archive, forks its run in sandbox mode from its fork point,
executes the fork in this process on the code as it is now, prints each verdict, drops the
database, and exits with status 1 if a verdict is not the expected one (for CI: an incident
that was fixed stays fixed). The agents are this process's (AGENTRUN_AGENT_MODULES).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test.utils import setup_databases, teardown_databases

from agentrun.models import Verdict
from agentrun.testing import replay_archive

EXPECTED = (*Verdict.values, "skipped")


class Command(BaseCommand):
    help = "Replay exported runs on the current code in a throwaway database; check verdicts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("archives", nargs="+", metavar="ARCHIVE")
        parser.add_argument("--expect", default="fixed", choices=EXPECTED)
        parser.add_argument("--from", dest="start_from", default="before-failure")

    def handle(self, *args: Any, archives: list[str], expect: str, **o: Any) -> None:
        for name in archives:
            if not Path(name).is_file():
                raise CommandError(f"{name}: no such archive")
        db = settings.DATABASES["default"]
        if not db["ENGINE"].endswith("sqlite3"):  # its own name: never another test database
            db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_replaytest_{os.getpid()}"
        old = setup_databases(verbosity=0, interactive=False)
        try:
            results = []
            for name in archives:
                try:
                    results += replay_archive(name, start_from=o["start_from"])
                except ValueError as exc:
                    raise CommandError(str(exc)) from None
        finally:
            teardown_databases(old, verbosity=0)
        wrong = 0
        for r in results:
            ok = r.verdict == expect
            wrong += not ok
            self.stdout.write(("ok    " if ok else "FAIL  ") + r.line())
        self.stdout.write(f"{len(results) - wrong} of {len(results)} replays {expect}")
        if wrong:
            raise SystemExit(1)
