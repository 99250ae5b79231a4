"""Export a run to an archive (agentrun.lifecycle.archive, docs/ARCHIVE.md).

    manage.py exportrun RUN_ID [-o FILE] [--with-ancestors]

Writes the gzip'ed archive to FILE (default run-<id>.agentrun.jsonl.gz; `-` for
stdout) as the rows are read, and prints the file's name and size on stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.lifecycle import archive
from agentrun.management.commands.fork import find_run


class Command(BaseCommand):
    help = (
        "Export a run (its steps, tool calls, snapshots, events and lineage) to a "
        "self-contained gzip'ed JSON-lines archive that `importrun` reads."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", help="the run to export (a UUID)")
        parser.add_argument(
            "-o", "--output", help="the archive's file (default: run-<id>.agentrun.jsonl.gz)"
        )
        parser.add_argument(
            "--with-ancestors",
            action="store_true",
            help="also the runs it was forked from, so the archive keeps its fork links",
        )

    def handle(
        self, *args: Any, run_id: str, output: str | None, with_ancestors: bool, **options: Any
    ) -> None:
        run = find_run(run_id)
        problem = archive.export_problem(run)
        if problem:
            raise CommandError(problem)
        chunks = archive.export_chunks(run, ancestors=with_ancestors)
        if output == "-":
            for chunk in chunks:
                sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            return
        path = Path(output or archive.filename(run))
        partial = path.with_name(path.name + ".partial")
        try:
            with open(partial, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
            os.replace(partial, path)  # never a half-written archive under the name asked for
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise CommandError(f"can't write {path}: {exc}") from None
        self.stderr.write(f"{path} ({path.stat().st_size} bytes)")
