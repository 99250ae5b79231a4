"""Replay every run an incident hit, as a batch: sandbox first, then promote it live.

    manage.py replay --filter label=problem=stale-cart --filter status=failed
                     --from before-failure|start|tool:NAME|step:N --mode sandbox|recorded|live
                     --version V --name "..." [--reason R] [--max-in-flight N]
                     [--dry-run] [--wait] [--confirm-live] [--user NAME]
    manage.py replay --promote BATCH [--confirm-live] [--dry-run] [--wait] [--user NAME]
    manage.py replay --cancel BATCH [--reason R] [--user NAME]
    manage.py replay --status BATCH

--filter takes the run list's parameters (`q`, `status`, `agent`, `label`, `pinned`,
`since`, `until`, `error`, `version`, `tool_failed`), each `name=value`, repeatable (labels
add up). --dry-run prints the preview and creates nothing. --wait follows the batch until it
ends and prints its verdicts; it exits with status 1 when a run is not fixed or unchanged.
Every error is a CommandError and creates nothing.
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.lifecycle import batches
from agentrun.management.commands.fork import find_operator
from agentrun.models import ReplayBatch

GOOD = ("fixed", "unchanged")


def parse_filter(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--filter {item!r}: write it as name=value (e.g. status=failed)")
        if name == "label":
            out.setdefault("label", []).append(value)
        elif name in out:
            raise CommandError(f"--filter {name} is given twice")
        else:
            out[name] = value
    return out


def find_batch(batch_id: str) -> ReplayBatch:
    """The batch whose id is `batch_id` or starts with it (4 hex characters at least)."""
    compact = batch_id.strip().lower().replace("-", "")
    if not 4 <= len(compact) <= 32 or any(c not in "0123456789abcdef" for c in compact):
        raise CommandError(f"{batch_id!r} is not a batch id (give 4 or more hex characters)")
    first, last = UUID(compact.ljust(32, "0")), UUID(compact.ljust(32, "f"))
    matches = list(ReplayBatch.objects.filter(pk__range=(first, last))[:2])
    if len(matches) != 1:
        what = "no batch" if not matches else "more than one batch"
        raise CommandError(f"{what} has an id starting with {compact!r}")
    return matches[0]


class Command(BaseCommand):
    help = "Replay the runs a filter selects, each from its own fork point, as a batch."

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # --version is the code version to replay on: it replaces Django's own --version.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--filter", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--from", dest="start_from", default="before-failure")
        parser.add_argument("--mode", default="sandbox", choices=batches.MODES)
        parser.add_argument("--version", default=None)
        parser.add_argument("--name", default=None)
        parser.add_argument("--reason", default="")
        parser.add_argument("--max-in-flight", type=int, default=None)
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--wait", action="store_true")
        parser.add_argument("--confirm-live", action="store_true")
        parser.add_argument("--user", default=None, help="The operator recorded as its author.")
        parser.add_argument("--timeout", type=float, default=3600, help="--wait: seconds.")
        which = parser.add_mutually_exclusive_group()
        which.add_argument("--promote", metavar="BATCH")
        which.add_argument("--cancel", metavar="BATCH")
        which.add_argument("--status", metavar="BATCH")

    def handle(self, *args: Any, **o: Any) -> None:
        if o["status"]:
            self.show(find_batch(o["status"]))
            return
        user = find_operator(o["user"], "replaying runs")
        try:
            if o["cancel"]:
                self.show(batches.cancel(find_batch(o["cancel"]), user=user, reason=o["reason"]))
                return
            if o["promote"]:
                batch = self.promote(find_batch(o["promote"]), user, o)
            else:
                batch = self.create(user, o)
        except batches.BatchError as exc:
            where = f"--{exc.field.replace('_', '-')}: " if exc.field else ""
            raise CommandError(f"{where}{exc}") from None
        if batch is None:
            return
        self.stdout.write(f"batch {batch.pk} ({batch.name}): {batch.mode}, {self.count(batch)}")
        if o["wait"]:
            batch = self.wait(batch, o["timeout"])
            self.show(batch)
            verdicts = batches.counts(batch)["verdicts"]
            if any(n for v, n in verdicts.items() if v not in GOOD):
                raise SystemExit(1)

    def create(self, user: Any, o: dict[str, Any]) -> ReplayBatch | None:
        selection = parse_filter(o["filter"])
        if o["dry_run"]:
            self.preview(batches.plan(selection, o["start_from"], o["mode"], o["version"]))
            return None
        if not o["name"]:
            raise CommandError("--name: a batch needs a name (e.g. the incident it repairs)")
        return batches.create(
            selection,
            o["start_from"],
            mode=o["mode"],
            version=o["version"],
            name=o["name"],
            reason=o["reason"],
            max_in_flight=o["max_in_flight"],
            user=user,
            confirm_live=o["confirm_live"],
        )

    def promote(self, batch: ReplayBatch, user: Any, o: dict[str, Any]) -> ReplayBatch | None:
        if o["dry_run"]:
            self.preview(batches.promotion_plan(batch, version=o["version"]))
            return None
        return batches.promote(
            batch,
            user=user,
            name=o["name"],
            reason=o["reason"],
            version=o["version"],
            max_in_flight=o["max_in_flight"],
            confirm_live=o["confirm_live"],
        )

    def preview(self, plan: batches.Plan) -> None:
        self.stdout.write(
            f"{plan.count} run(s) to replay {plan.start.describe()}, {plan.skipped} skipped;"
            f" mode {plan.mode}" + (f", on version {plan.version}" if plan.version else "")
        )
        for item in plan.items:
            where = f"step {item.step}" if item.step else f"skipped: {item.skip_reason}"
            self.stdout.write(f"  {str(item.run.pk)[:8]}  {item.run.status:<10} {where}")
        if plan.mode == "live":
            effects = ", ".join(f"{tool} ×{n}" for tool, n in plan.side_effects.items())
            self.stdout.write(f"side effects it lets happen: {effects or 'none known'}")

    def count(self, batch: ReplayBatch) -> str:
        runs = batches.counts(batch)["runs"]
        return ", ".join(f"{n} {state}" for state, n in runs.items() if n)

    def wait(self, batch: ReplayBatch, timeout: float) -> ReplayBatch:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            batch.refresh_from_db()
            now = self.count(batch)
            if now != last:
                self.stderr.write(f"  {now}")
                last = now
            if batch.status != "running" and not batches.counts(batch)["runs"]["running"]:
                return batch
            time.sleep(1)
        raise CommandError(f"the batch did not end within {timeout:.0f} s (it goes on)")

    def show(self, batch: ReplayBatch) -> None:
        counts = batches.counts(batch)
        self.stdout.write(f"batch {batch.pk} ({batch.name}): {batch.status}, {self.count(batch)}")
        for verdict, n in counts["verdicts"].items():
            if n:
                self.stdout.write(f"  {verdict.replace('_', ' ')}: {n}")
