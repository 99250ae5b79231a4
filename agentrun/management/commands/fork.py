"""Fork a run from the command line.

    manage.py fork RUN_ID STEP --at pre|post --mode sandbox|recorded|live
                   [--state @file|JSON] [--reason R] [--confirm-live] [--user NAME]
                   [--version V]

Prints the new run's id on stdout (and nothing else there, so that
`FORK=$(manage.py fork ...)` works). The parent's write/hybrid calls that a
live fork would run again go to stderr; without --confirm-live such a fork is
refused. Every error is a CommandError and stores nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.agents import InvalidInput
from agentrun.lifecycle import services
from agentrun.lifecycle.runids import RunIdError, resolve_run
from agentrun.models import Run, ToolCall
from agentrun.security.roles import can_operate, role_of
from agentrun.security.storable import parse_json

#: Snapshot positions are 32-bit integers: a step beyond this can't exist.
MAX_STEP = 10**9


def read_state(value: str) -> Any:
    """The edited state from JSON text, or from a file when it starts with @."""
    text, source = value, "--state"
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text, source = path.read_text(encoding="utf-8"), f"--state {path}"
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"can't read the state file {path}: {exc}") from None
    try:
        return parse_json(text)
    except ValueError as exc:
        raise CommandError(f"{source}: {exc}") from None


def parse_step(value: str) -> int:
    try:
        step = int(value.strip())
    except ValueError:
        raise CommandError(f"step must be an integer, not {value!r}") from None
    if not -MAX_STEP <= step <= MAX_STEP:
        raise CommandError(f"step {step} is out of range: no run has that many steps")
    return step


def find_run(run_id: str) -> Run:
    """The run by its id or a unique prefix of it (the 8 characters pages show)."""
    try:
        return resolve_run(run_id)
    except RunIdError as exc:
        raise CommandError(str(exc)) from None


def find_operator(name: str | None, action: str = "forking") -> Any:
    """The user the fork is recorded under: an active operator (or admin), if named."""
    if name is None:
        return None
    user = get_user_model().objects.filter(username=name).first()
    if user is None or not user.is_active:
        raise CommandError(f"no active user named {name!r}")
    if not can_operate(user):
        role = role_of(user) or "user without a role"
        raise CommandError(f"{action} needs the operator role; {name!r} is a {role}")
    return user


def describe(calls: list[ToolCall]) -> list[str]:
    return [
        f"  step {tc.step.number} call {tc.index}: {tc.tool} ({tc.kind}, was {tc.status}) "
        f"args={json.dumps(tc.args, sort_keys=True, ensure_ascii=False)} "
        f"key={tc.idempotency_key}"
        + (
            " compensation=" + json.dumps(tc.compensation, sort_keys=True)
            if tc.compensation
            else ""
        )
        for tc in calls
    ]


class Command(BaseCommand):
    help = (
        "Fork a run from the pre or post snapshot of a step, optionally with an edited state, "
        "and print the new run's id. A live fork that would run the parent's write/hybrid "
        "calls again lists them and needs --confirm-live."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "run_id", help="the run to fork: its id, or the first 4+ characters of it"
        )
        parser.add_argument("step", help="the step whose snapshot to fork from")
        parser.add_argument(
            "--at", required=True, help="pre (redo the step) or post (start at the next one)"
        )
        parser.add_argument(
            "--mode",
            required=True,
            help="sandbox (no write/hybrid tool runs), recorded (reuse the parent's decisions "
            "and results until the state diverges) or live (everything runs for real)",
        )
        parser.add_argument(
            "--state", help="the whole edited state as JSON, or @path to a JSON file"
        )
        parser.add_argument("--reason", default="", help="why; recorded in the audit trail")
        parser.add_argument(
            "--confirm-live",
            action="store_true",
            help="run the parent's write/hybrid calls after the fork point again (live mode)",
        )
        parser.add_argument("--user", help="the operator the fork is recorded under")
        parser.add_argument(
            "--version",
            default=None,
            help="the code version to run the fork on: only workers of it execute it",
        )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # --version is the code version to run on: it replaces Django's own --version.
        return super().create_parser(prog_name, subcommand, conflict_handler="resolve", **kwargs)

    def handle(
        self,
        *args: Any,
        run_id: str,
        step: str,
        at: str,
        mode: str,
        state: str | None,
        reason: str,
        confirm_live: bool,
        user: str | None,
        version: str | None = None,
        **options: Any,
    ) -> None:
        run = find_run(run_id)
        number = parse_step(step)
        edited = read_state(state) if state is not None else None
        operator = find_operator(user)
        try:
            fork = services.fork_run(
                run,
                step=number,
                at=at,
                state=edited,
                mode=mode,
                reason=reason,
                user=operator,
                confirm_live=confirm_live,
                version=version,
            )
        except services.ForkError as exc:
            if exc.field != "confirm_live":
                raise CommandError(str(exc)) from None
            effects = services.side_effects_after(run, number, at)
            self.stderr.write(
                f"a live fork from the {at} snapshot of step {number} would run these "
                f"{len(effects)} write/hybrid call(s) of the parent again, with its own "
                "idempotency keys:"
            )
            for line in describe(effects):
                self.stderr.write(line)
            raise CommandError(
                f"{exc}: pass --confirm-live to run them; nothing was created"
            ) from None
        except InvalidInput as exc:  # the parent's agent is not registered here
            raise CommandError(f"can't fork this run: {exc}") from None
        if mode == "live":
            effects = services.side_effects_after(run, number, at)
            if effects:
                self.stderr.write(f"confirmed: {len(effects)} write/hybrid call(s) run again:")
                for line in describe(effects):
                    self.stderr.write(line)
        self.stdout.write(str(fork.pk))
