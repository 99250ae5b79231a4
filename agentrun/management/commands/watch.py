"""The history of one value of a run's state, from the command line.

    manage.py watch RUN_ID PATH [--json] [--limit N]

PATH is a JSON pointer (/memory/notes/cart) or a dotted path (memory.notes.cart,
history.3.content, history[3]). Prints every step that changed the value, with the
value before and after and what the step decided; a fork's history goes on into its
parent before the fork point (marked inherited). --json prints what the API's
GET /api/runs/{id}/history answers, every change included. --limit N: only the first N
changes, the run read only as far as them (and one more). Errors are CommandErrors.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.management.commands.fork import find_run
from agentrun.store import watch

PREVIEW = 120


def preview(value: Any) -> str:
    if value is watch.MISSING:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


class Command(BaseCommand):
    help = "List every step that changed one value of a run's state (a path)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("path", help="/memory/notes/cart or memory.notes.cart")
        parser.add_argument("--json", action="store_true", help="print the API's JSON")
        parser.add_argument("--limit", type=int, help="only the first N changes")

    def handle(self, *args: Any, **options: Any) -> None:
        run = find_run(options["run_id"])
        try:
            path = watch.parse_path(options["path"])
        except watch.PathSyntaxError as exc:
            raise CommandError(f"bad path: {exc}") from None
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        found = watch.history(run, path, limit=options["limit"])
        if options["json"]:
            details = watch.step_details(found.changes)
            body = {
                "run_id": str(run.pk),
                "path": found.display,
                "pointer": watch.pointer(path),
                "ever_existed": found.ever_existed,
                "exists_now": found.exists_now,
                "count": None if found.more else len(found.changes),
                "more": found.more,
                "changes": [watch.change_json(c, details) for c in found.changes],
            }
            self.stdout.write(json.dumps(body, default=str, ensure_ascii=False, indent=2))
            return
        self.stdout.write(f"{found.display} in run {run.pk}")
        if not found.ever_existed:
            self.stdout.write(f"{found.display} never existed in this run: no snapshot has it.")
            return
        start = found.start
        self.stdout.write(
            f"at the start (step {start.step} {start.at}"
            f"{'' if str(start.run_id) == str(run.pk) else f', run {start.run_id}'}): "
            f"{preview(start.value)}"
        )
        if not found.changes:
            self.stdout.write("never changed")
        details = watch.step_details(found.changes)
        for c in found.changes:
            mark = " [inherited from the parent]" if c.inherited else ""
            self.stdout.write(f"step {c.step} {c.at}: {c.kind} ({c.how}){mark}")
            self.stdout.write(f"    before: {preview(c.before)}")
            self.stdout.write(f"    after:  {preview(c.after)}")
            decision = (details.get((str(c.run_id), c.step)) or {}).get("decision")
            if decision:
                tools = ", ".join(str(call["tool"]) for call in decision["calls"])
                self.stdout.write(
                    f"    decided: {decision['thought'][:PREVIEW]}"
                    + (f" (calls {tools})" if tools else "")
                )
        if found.more:
            self.stdout.write("... and more after these (a higher --limit shows them)")
        count = f"{'more than ' if found.more else ''}{len(found.changes)}"
        self.stdout.write(f"{count} change(s); now: {preview(found.current)}")
