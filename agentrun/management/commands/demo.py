"""`manage.py demo`: demo users and a set of finished demo runs, in seconds.

Idempotent: missing users are created, and a demo run that exists already
(found by its label) is not created again, only driven on if it was left
unfinished. After the incident story comes the operator's fix: a sandbox fork
of the incident run at the pre snapshot of the recommendation step, with the
cart in the agent's memory corrected (found again by its parent and mode). Runs are driven in this process with `engine.execute_step`, so no
worker is needed; the worker-crash story runs its crashing step in a child
process, which really dies (os._exit), and resumes here once its lease expires.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from agentrun import engine
from agentrun.builtin.shop import STAGE_STEPS, cart_as_of, read_note, write_note
from agentrun.lifecycle import labels as run_labels
from agentrun.lifecycle import services
from agentrun.models import TERMINAL_STATUSES, LedgerEntry, Run, RunStatus, ToolCall, WaitReason
from agentrun.security.roles import create_user, role_of
from agentrun.store import snapshots

PASSWORD = "demo"  # noqa: S105 — the documented demo login
DEMO_USERS = [("admin", "admin"), ("operator", "operator"), ("viewer", "viewer")]
#: The crashing child holds its lease this long; the demo waits it out before resuming.
CRASH_LEASE_SECONDS = 2
#: No story may take longer than this (they take a few seconds).
STORY_TIMEOUT = 40.0


@dataclass
class Story:
    label: str
    title: str
    agent: str
    input: dict[str, Any]
    approve: bool = True
    crash_step: int | None = None
    expect: str = "succeeded"
    #: Beyond source=demo, story=<label> and the customer: what an operator would tag it with.
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        customer = {"customer": self.input["user"]} if "user" in self.input else {}
        return {"source": "demo", "story": self.label, **customer, **self.tags}

    def find(self) -> Run | None:
        # Forks copy their parent's input, label included: the demo run is the root.
        runs = Run.objects.filter(agent=self.agent, parent__isnull=True)
        if self.agent == "shop":
            runs = runs.filter(input__demo=self.label)
        else:  # the scripted agent accepts no extra keys: its label is in the goal
            runs = runs.filter(input__goal=self.input["goal"])
        return runs.order_by("created_at").first()


@dataclass
class Row:
    """A line of the closing table."""

    run: Run
    label: str
    title: str
    expect: str
    created: bool


#: The operator's fix for the incident story.
FIX_LABEL = "incident-fix"
FIX_OF = "incident"
FIX_STEP = STAGE_STEPS["recommend"]
FIX_MODE = "sandbox"
FIX_REASON = "cart change never reached the agent's context"
FIX_TITLE = f"Fix: incident forked at step {FIX_STEP} (pre), cart corrected; sandbox"
#: The fix's own labels, beside those it inherits from the incident run.
FIX_LABELS = {"fix": "cart-corrected"}


def add_missing_labels(run: Run, labels: dict[str, str]) -> None:
    """Label a demo run made by an older demo, before runs had labels."""
    if not run.labels.exists():
        run_labels.store(run, labels)


def find_fix(incident: Run) -> Run | None:
    return Run.objects.filter(parent=incident, mode=FIX_MODE).order_by("created_at").first()


def corrected_state(run: Run, step: int) -> dict[str, Any]:
    """The pre state of `step` with memory.notes.cart as the user's cart really was then."""
    state = snapshots.load(run.pk, step, "pre")
    notes = state["memory"]["notes"]
    still_there = {line["sku"] for line in cart_as_of(run.input, step)}
    remembered = read_note(notes, "cart", [])
    write_note(notes, "cart", [line for line in remembered if line.get("sku") in still_there])
    return state


def shop(label: str, user: str, **world: Any) -> dict[str, Any]:
    return {
        "goal": "Get me ready for a weekend camping trip",
        "user": user,
        "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
        **world,
        "demo": label,
    }


def scripted(label: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"goal": f"[demo:{label}] {steps[-1]['final']}", "steps": steps}


def _twelve_steps() -> list[dict[str, Any]]:
    def call(tool: str, thought: str, **args: Any) -> dict[str, Any]:
        return {"thought": thought, "calls": [{"tool": tool, "args": args}]}

    return [
        call("echo", "Collect the invoices", source="inbox", count=3),
        call("echo", "Read invoice 1", invoice=1, amount=120),
        call("echo", "Read invoice 2", invoice=2, amount=75),
        call("flaky", "Look up the supplier (its API fails once)", failures=1, supplier="ACME"),
        call("echo", "Read invoice 3", invoice=3, amount=42),
        call("echo", "Add them up", total=237),
        call("ledger_write", "Book the total", account="suppliers:acme", amount=237),
        call("sleep", "Wait for the bank", seconds=0.05),
        call("echo", "Check the booking", booked=237),
        call("notify", "Tell accounting", to="accounting@example.com", body="237 booked"),
        call("echo", "File the invoices", filed=3),
        {"thought": "All done", "final": "3 invoices, 237 booked for ACME"},
    ]


STORIES = [
    Story(
        "happy-path",
        "Happy path: the operator approves the payment",
        "shop",
        shop("happy-path", "ana"),
        tags={"approval": "approved"},
    ),
    Story(
        "incident",
        "Incident: STOVE-1 removed after step 2, yet recommended for and reserved",
        "shop",
        shop("incident", "ben", cart_changes=[{"after_step": 2, "remove": "STOVE-1"}]),
        tags={"problem": "stale-cart", "cart-change": "STOVE-1-removed-after-step-2"},
    ),
    Story(
        "flaky-shipping",
        "Shipping API timed out twice at step 6, retried after backoff",
        "shop",
        shop("flaky-shipping", "chloe", shipping_timeouts=2),
        tags={"fault": "shipping-timeout"},
    ),
    Story(
        "worker-crash",
        "Worker killed after placing the order at step 8; resumed",
        "shop",
        shop("worker-crash", "dev", crash="crash_after"),
        crash_step=STAGE_STEPS["order"],
        tags={"fault": "worker-killed"},
    ),
    Story(
        "awaiting-approval",
        "Paused: the payment at step 7 awaits an operator",
        "shop",
        shop("awaiting-approval", "emma"),
        approve=False,
        expect="waiting",
        tags={"approval": "pending"},
    ),
    Story(
        "card-declined",
        "Card declined at step 7; the reservations were released",
        "shop",
        shop("card-declined", "farid", fail_payment=True),
        expect="failed",
        tags={"fault": "card-declined"},
    ),
    Story(
        "scripted-short",
        "Scripted: one tool call and an answer",
        "scripted",
        scripted(
            "scripted-short",
            [
                {
                    "thought": "Say hello",
                    "calls": [{"tool": "echo", "args": {"greeting": "hello"}}],
                },
                {"thought": "Done", "final": "hello"},
            ],
        ),
    ),
    Story(
        "scripted-12",
        "Scripted: 12 steps with a flaky call, a write and an e-mail",
        "scripted",
        scripted("scripted-12", _twelve_steps()),
        tags={"fault": "flaky-tool"},
    ),
]


class Command(BaseCommand):
    help = "Create the demo users and demo runs (idempotent; takes a few seconds)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--no-logins",
            action="store_true",
            help="don't list the demo users (`up` lists them once everything is up)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        users = {role: demo_user(name, role) for name, role in DEMO_USERS}
        if not opts["no_logins"]:
            self.stdout.write("demo users (username / password, role):")
            for name, role in DEMO_USERS:
                self.stdout.write(f"  {name} / {PASSWORD}  ({role})")
        operator = users["operator"]

        # No wake-up messages: this process drives the runs, and a worker racing it for
        # the next step would make the stories (the crash above all) nondeterministic.
        enqueue = settings.AGENTRUN_ENQUEUE
        settings.AGENTRUN_ENQUEUE = False
        rows: list[Row] = []
        try:
            for story in STORIES:
                rows.append(self._play(story, operator))
                if story.label == FIX_OF:
                    rows.append(self._fix(rows[-1].run, operator))
        finally:
            settings.AGENTRUN_ENQUEUE = enqueue
        self._table(rows)

    def _play(self, story: Story, operator: Any) -> Row:
        run = story.find()
        created = run is None
        if run is None:
            run = services.start_run(story.agent, story.input, user=operator, labels=story.labels)
        else:
            add_missing_labels(run, story.labels)  # made before runs had labels
        run = advance(
            run, operator, approve=story.approve, crash_step=story.crash_step, out=self.stdout
        )
        if story.crash_step is not None:
            self._check_exactly_once(run, story.label)
        return Row(run, story.label, story.title, story.expect, created)

    def _fix(self, incident: Run, operator: Any) -> Row:
        """The operator's fix: replay the incident from step 3 with the cart corrected."""
        fork = find_fix(incident)
        created = fork is None
        if fork is None:
            try:
                fork = services.fork_run(
                    incident,
                    step=FIX_STEP,
                    at="pre",
                    state=corrected_state(incident, FIX_STEP),
                    mode=FIX_MODE,
                    reason=FIX_REASON,
                    user=operator,
                    labels=FIX_LABELS,
                )
            except services.ForkError as exc:
                raise CommandError(f"{FIX_LABEL}: can't fork the incident run: {exc}") from None
        else:
            inherited = {**run_labels.of(incident), **FIX_LABELS}
            add_missing_labels(fork, run_labels.for_fork(inherited, incident.pk))
        fork = advance(fork, operator, out=self.stdout)
        return Row(fork, FIX_LABEL, FIX_TITLE, "succeeded", created)

    def _check_exactly_once(self, run: Run, label: str) -> None:
        keys = ToolCall.objects.filter(run=run, kind="write").values_list(
            "idempotency_key", flat=True
        )
        rows = {key: LedgerEntry.objects.filter(idempotency_key=key).count() for key in keys}
        rows = {key: n for key, n in rows.items() if n}
        if any(n != 1 for n in rows.values()):
            raise CommandError(f"{label}: ledger rows per key {rows}; expected exactly one")
        self.stdout.write(f"  {label}: {len(rows)} ledger keys, exactly one row each")

    def _table(self, rows: list[Row]) -> None:
        self.stdout.write("")
        self.stdout.write(
            f"{'run id':36}  {'story':18}  {'status':18}  {'steps':>5}  {'':3}  what it shows"
        )
        for row in rows:
            run = row.run
            status = run.status + (f" ({run.wait_reason})" if run.wait_reason else "")
            self.stdout.write(
                f"{run.pk!s:36}  {row.label:18}  {status:18}  {run.steps_done:>5}  "
                f"{'new' if row.created else '   '}  {row.title}"
            )
        # An operator may have acted on a demo run since (approved the paused one...).
        for row in rows:
            if row.run.status != row.expect:
                self.stdout.write(f"note: {row.label} is {row.run.status}, not {row.expect}")


def demo_user(name: str, role: str) -> Any:
    """The demo user, created with the demo password unless it exists with its role.

    An existing user keeps its password: hashing one costs a second, and an
    operator who changed it meant to.
    """
    user = get_user_model().objects.filter(username=name).first()
    if user is not None and role_of(user) == role:
        return user
    return create_user(name, role, PASSWORD)


# --- driving a run in this process ------------------------------------------------------


def advance(
    run: Run,
    operator: Any,
    *,
    approve: bool = True,
    crash_step: int | None = None,
    timeout: float = STORY_TIMEOUT,
    out: Any = None,
) -> Run:
    """Execute the run's steps here until it finishes or waits for an operator.

    Approvals are given by `operator` when `approve`; backoffs and leases held by
    someone else are waited out. `crash_step` is executed once in a child process
    with fault points armed, so the worker really dies there.
    """
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        run.refresh_from_db()
        if run.status in TERMINAL_STATUSES:
            return run
        if run.status == RunStatus.WAITING:
            if run.wait_reason == WaitReason.APPROVAL and approve:
                services.decide_approval(
                    run,
                    user=operator,
                    decision="approve",
                    comment="demo: the amount matches the cart",
                )
                continue
            if run.wait_reason != WaitReason.BACKOFF:
                return run  # an operator's turn
            if run.wake_at and run.wake_at > timezone.now():
                _sleep_until(run.wake_at, give_up)
            else:
                engine.execute_step(run.pk, run.next_step)
        elif run.lease_expires_at and run.lease_expires_at > timezone.now():
            _sleep_until(run.lease_expires_at, give_up)  # held by a worker, maybe a dead one
        elif run.next_step == crash_step and not _attempted(run, crash_step):
            _crash_in_child(run, crash_step, out)
        else:
            engine.execute_step(run.pk, run.next_step)
    raise CommandError(f"run {run.pk} did not settle within {timeout:g}s (it is {run.status})")


def _sleep_until(when: datetime | None, give_up: float) -> None:
    wait = (when - timezone.now()).total_seconds() if when else 0.0
    time.sleep(min(max(wait, 0.0) + 0.02, max(give_up - time.monotonic(), 0.0)))


def _attempted(run: Run, step: int) -> bool:
    """Whether a call of the step has started an attempt (so its fault point has fired)."""
    return ToolCall.objects.filter(run=run, step__number=step).exclude(attempts=[]).exists()


def _crash_in_child(run: Run, step: int, out: Any) -> None:
    code = (
        "import django; django.setup(); from agentrun import engine; "
        f"print(engine.execute_step({str(run.pk)!r}, {step}).status)"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentrun.settings",
        "DATABASE_URL": database_url(),
        "AGENTRUN_FAULTS": "1",
        "AGENTRUN_ENQUEUE": "0",
        "AGENTRUN_LEASE_SECONDS": str(CRASH_LEASE_SECONDS),
    }
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if not _attempted(run, step):
        raise CommandError(
            f"the crashing child did not reach step {step}'s tool call: {child.stderr[-2000:]}"
        )
    if out is not None:
        how = "died" if child.returncode else "finished without crashing"
        out.write(
            f"  worker-crash: the child worker {how} at step {step} (exit code "
            f"{child.returncode}); resuming once its lease expires"
        )


def database_url() -> str:
    """A DATABASE_URL for the database this process uses (a test database included)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return "sqlite://" + quote(str(db["NAME"]))
    if connection.vendor != "postgresql":
        raise CommandError(f"the crash demo needs SQLite or PostgreSQL, not {connection.vendor}")
    auth = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or ""  # empty: the local socket
    port = f":{db['PORT']}" if db.get("PORT") else ""
    options = {k: v for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, str | int)}
    query = "?" + urlencode(options) if options else ""
    return f"postgres://{auth}{'@' if auth else ''}{host}{port}/{quote(db['NAME'], safe='')}{query}"
