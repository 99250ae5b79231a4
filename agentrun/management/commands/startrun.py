"""Start a run from the command line:
`manage.py startrun AGENT --input JSON|@file [--label KEY=VALUE]... [--user NAME] [--wait]`.

Prints the run's id on stdout, and its page on stderr. With --wait, then its status and its
final answer or error."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from agentrun.agents import InvalidInput
from agentrun.engine import inflight
from agentrun.lifecycle import labels as run_labels
from agentrun.lifecycle import services
from agentrun.management.commands.fork import find_operator
from agentrun.models import Run, RunStatus
from agentrun.security.storable import parse_json

# --wait exit codes: 0 only when the run succeeded.
EXIT_FAILED = 1  # failed or cancelled
EXIT_WAITING = 2  # parked for an operator
EXIT_TIMEOUT = 3  # still going when --timeout ran out
POLL_SECONDS = 0.5


def read_input(value: str) -> Any:
    """The run input from a JSON string, or from a file when it starts with @."""
    text, source = value, "--input"
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"can't read input file {path}: {exc}") from None
    try:
        return parse_json(text)
    except ValueError as exc:
        raise CommandError(f"{source}: {exc}") from None


def status_line(run: Run) -> str:
    if run.status == RunStatus.FAILED:
        return f"failed: {run.error}"
    if run.status == RunStatus.WAITING:
        why = inflight.explain(run.pk)
        return f"waiting ({run.wait_reason})" + (f": {why}" if why else "")
    return str(run.status)


def wait_for(run: Run, timeout: float) -> Run | None:
    """Poll until the run is finished or waits for an operator; None on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        run.refresh_from_db()
        if not run.is_active or (run.status == RunStatus.WAITING and run.wait_reason != "backoff"):
            return run
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(POLL_SECONDS, left))


class Command(BaseCommand):
    help = (
        "Start a run and print its id. With --wait, poll until it finishes or waits for an "
        "operator, print its status, and exit 0 only if it succeeded (1 failed or cancelled, "
        "2 waiting, 3 timeout)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="a registered agent, e.g. scripted")
        parser.add_argument(
            "--input", required=True, help="the input as JSON, or @path to a JSON file"
        )
        parser.add_argument(
            "--label",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            dest="labels",
            help="a label to find the run by, e.g. --label story=stale-cart (repeatable)",
        )
        parser.add_argument(
            "--user", help="the operator the run is recorded as started by (default: nobody)"
        )
        parser.add_argument("--wait", action="store_true", help="wait for the run to stop moving")
        parser.add_argument(
            "--timeout", type=float, default=300.0, help="seconds to wait (default 300)"
        )

    def handle(
        self,
        *args: Any,
        agent: str,
        input: str,
        labels: list[str],
        wait: bool,
        timeout: float,
        user: str | None = None,
        **options: Any,
    ) -> None:
        operator = find_operator(user, "starting a run")
        try:
            checked = run_labels.parse(labels)
        except run_labels.InvalidLabels as exc:
            raise CommandError(f"--label: {exc}") from None
        data = read_input(input)
        try:
            run = services.start_run(agent, data, labels=checked, user=operator)
        except InvalidInput as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(run.pk))
        self.stderr.write(
            f"{settings.AGENTRUN_SITE_URL}{reverse('debugger:run-detail', args=[run.pk])}"
        )
        if not wait:
            return
        done = wait_for(run, timeout)
        if done is None:
            why = inflight.explain(run.pk)
            self.stdout.write(
                f"timeout: still {run.status} after {timeout:g}s" + (f": {why}" if why else "")
            )
            raise SystemExit(EXIT_TIMEOUT)
        self.stdout.write(status_line(done))
        if done.final_answer:
            self.stdout.write(f"answer: {done.final_answer}")
        if done.status == RunStatus.WAITING:
            raise SystemExit(EXIT_WAITING)
        if done.status != RunStatus.SUCCEEDED:
            raise SystemExit(EXIT_FAILED)
