"""Import a run's archive, read-only (agentrun.lifecycle.archive, docs/ARCHIVE.md).

    manage.py importrun FILE [--user NAME]

Checks the whole archive first (format version, every snapshot's hash, the
digest, sizes), then stores its runs in one transaction. Prints the imported
run's id on stdout; a bad archive is a CommandError and stores nothing.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.lifecycle import archive
from agentrun.management.commands.fork import find_operator


class Command(BaseCommand):
    help = "Import a run's archive (from `exportrun` or the API) as a read-only run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the archive (.agentrun.jsonl.gz)")
        parser.add_argument("--user", help="the operator the import is recorded under")

    def handle(self, *args: Any, file: str, user: str | None, **options: Any) -> None:
        path = Path(file)
        operator = find_operator(user)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise CommandError(f"can't read {path}: {exc.strerror}") from None
        if size > settings.AGENTRUN_IMPORT_MAX_BYTES:
            raise CommandError(
                f"{path} is {size} bytes; the limit is {settings.AGENTRUN_IMPORT_MAX_BYTES} "
                "(AGENTRUN_IMPORT_MAX_BYTES); nothing was imported"
            )
        try:
            runs = archive.import_archive(partial(path.open, "rb"), user=operator)
        except archive.ArchiveError as exc:
            raise CommandError(f"{path}: {exc}; nothing was imported") from None
        except OSError as exc:
            raise CommandError(f"can't read {path}: {exc}") from None
        for run in runs[:-1]:
            self.stderr.write(f"imported ancestor {run.pk}")
        self.stdout.write(str(runs[-1].pk))
