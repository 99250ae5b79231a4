"""`manage.py up`: everything in one terminal, for a laptop or a demo.

Migrates, seeds the demo (if the `demo` command exists), then starts and
watches two kinds of child processes with the same environment:
- Celery worker(s), the first with beat embedded (`-B`) so the reconciler runs;
- the web server (Django's runserver, static files served by staticfiles).
Ctrl-C or SIGTERM stops them cleanly; if one of them dies, the rest are stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError

DEFAULT_LOGINS = [
    ("admin", "admin", "demo"),
    ("operator", "operator", "demo"),
    ("viewer", "viewer", "demo"),
]
# How long a warm shutdown may take before it turns cold (SIGQUIT), then SIGKILL. Celery
# on the filesystem broker needs several seconds even when idle. A cold stop is safe by
# design: the step's lease expires and the reconciler re-enqueues it.
WARM_SECONDS = 30.0
COLD_SECONDS = 5.0


# --- what to start (pure functions, tested) ----------------------------------------


def worker_command(
    index: int, *, beat: bool, var_dir: Path, python: str = sys.executable
) -> list[str]:
    # No pool or concurrency flags: the Celery configuration has them (threads,
    # AGENTRUN_WORKER_CONCURRENCY), as for a plain `celery -A agentrun worker`.
    cmd = [
        python,
        "-m",
        "celery",
        "-A",
        "agentrun",
        "worker",
        "--loglevel",
        "INFO",
        "--hostname",
        f"up{index + 1}@%h",
        # One machine, no cluster: skip the startup sync and the gossip chatter.
        "--without-mingle",
        "--without-gossip",
    ]
    if beat:
        # Beat's schedule file goes under var/, not into the working directory.
        cmd += ["-B", "--schedule", str(Path(var_dir) / "celerybeat-schedule")]
    return cmd


def web_command(
    host: str, port: int, *, python: str = sys.executable, manage: Path | None = None
) -> list[str]:
    manage = manage or Path(settings.BASE_DIR) / "manage.py"
    # --insecure: serve static files through staticfiles even when DEBUG is off.
    return [
        python,
        str(manage),
        "runserver",
        "--noreload",
        "--insecure",
        f"{_host_for_bind(host)}:{port}",
    ]


def child_commands(
    host: str,
    port: int,
    workers: int,
    *,
    var_dir: Path,
    python: str = sys.executable,
    manage: Path | None = None,
) -> list[tuple[str, list[str]]]:
    """(name, argv) for every child process, in start order."""
    out = [
        (
            f"celery worker {i + 1}" + (" (+beat)" if i == 0 else ""),
            worker_command(i, beat=i == 0, var_dir=var_dir, python=python),
        )
        for i in range(workers)
    ]
    out.append(("web server", web_command(host, port, python=python, manage=manage)))
    return out


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _host_for_bind(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def url_for(host: str, port: int) -> str:
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}.get(host, _host_for_bind(host))  # noqa: S104
    return f"http://{shown}:{port}/"


def demo_logins() -> list[tuple[str, str, str]]:
    """(username, role, password) of the demo users, as the demo command defines them.

    The demo command may define DEMO_USERS (rows of username, role[, password], or
    dicts with those keys) and/or PASSWORD; otherwise admin/operator/viewer with "demo".
    """
    try:
        from agentrun.management.commands import demo
    except ImportError:
        return DEFAULT_LOGINS
    password = getattr(demo, "PASSWORD", None) or getattr(demo, "DEMO_PASSWORD", None)
    password = str(password or "demo")
    rows = getattr(demo, "DEMO_USERS", None)
    if not rows:
        return [(user, role, password) for user, role, _ in DEFAULT_LOGINS]
    out = []
    for row in rows:
        if isinstance(row, dict):
            name, role = row.get("username") or row.get("name"), row.get("role", "")
            out.append((str(name), str(role), str(row.get("password", password))))
        else:
            name, role, *rest = row
            out.append((str(name), str(role), str(rest[0]) if rest else password))
    return out


def broker_folders() -> list[Path]:
    """Folders the filesystem broker needs (kombu does not create them)."""
    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        return []
    opts = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    keys = ("data_folder_in", "data_folder_out", "processed_folder", "control_folder")
    return [Path(opts[k]) for k in keys if opts.get(k)]


def registered() -> list[str]:
    """Lines naming the agents and tools registered here, by the module that registers
    them: what the workers will know, since they import the same modules."""
    from agentrun.agents import AGENTS
    from agentrun.tools import REGISTRY

    def by_module(items: dict[str, str]) -> str:
        groups: dict[str, list[str]] = {}
        for name, module in sorted(items.items()):
            source = "built-in" if module.startswith("agentrun.builtin") else module
            groups.setdefault(source, []).append(name)
        order = sorted(groups, key=lambda source: (source != "built-in", source))
        return "; ".join(f"{', '.join(groups[source])} ({source})" for source in order)

    agents = {name: type(agent).__module__ for name, agent in AGENTS.items()}
    tools = {name: t.fn.__module__ for name, t in REGISTRY.items()}
    lines = [f"agents:   {by_module(agents)}", f"tools:    {by_module(tools)}"]
    if not settings.AGENTRUN_AGENT_MODULES:
        lines.append("          (your own: AGENTRUN_AGENT_MODULES=your.module, see the README)")
    return lines


# --- running them ------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the child gets SIGTERM if `up` itself is killed without a chance to stop it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: S110 - best effort
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Supervisor:
    """Starts children, notices one dying, stops them all: TERM, then QUIT, then KILL."""

    children: list[Child]
    env: dict[str, str] | None = None
    cwd: str | None = None
    out: Any = sys.stdout
    warm: float = WARM_SECONDS
    cold: float = COLD_SECONDS
    stopping: bool = False
    hurry: bool = False
    stopped: bool = False
    _signals: int = field(default=0)

    def say(self, msg: str) -> None:
        self.out.write(f"[up] {msg}\n")
        self.out.flush()

    def start(self) -> None:
        linux = sys.platform.startswith("linux")
        for child in self.children:
            # Each child in its own process group: a terminal's Ctrl-C reaches only `up`,
            # which stops the children once, in order, instead of them all at once.
            child.proc = subprocess.Popen(
                child.argv,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent if linux else None,
            )
            self.say(f"started {child.name} (pid {child.proc.pid})")

    def dead(self) -> Child | None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                return child
        return None

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        self._signals += 1
        if self._signals == 1:
            self.say(f"{signal.Signals(signum).name}: stopping (again to hurry)")
            self.stopping = True
        else:
            self.hurry = True

    def watch(self, poll: float = 0.5) -> int:
        """Block until a signal or a child's death; then stop everything. Returns the exit code."""
        code = 0
        while not self.stopping:
            child = self.dead()
            if child is not None:
                assert child.proc is not None
                self.say(
                    f"{child.name} exited with code {child.proc.returncode}; stopping the rest"
                )
                code = 1
                break
            time.sleep(poll)
        self.stop()
        return code

    def _send(self, sig: int) -> None:
        for child in self.children:
            if child.alive:
                assert child.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)

    def _wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not any(c.alive for c in self.children):
                return True
            if self.hurry:
                return False
            time.sleep(0.1)
        return not any(c.alive for c in self.children)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopping = self.stopped = True
        # SIGTERM is a warm shutdown for Celery (finish the task in hand), an exit for runserver.
        self._send(signal.SIGTERM)
        if not self._wait(self.warm):
            if any(c.alive for c in self.children):
                self.say("still running: cold shutdown")
            self._send(signal.SIGQUIT)
            self.hurry = False
            if not self._wait(self.cold):
                self._send(signal.SIGKILL)
        for child in self.children:
            if child.proc is not None:
                try:
                    child.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.say(f"{child.name} (pid {child.proc.pid}) did not stop")
        self.say("stopped")


def wait_for_port(host: str, port: int, timeout: float, alive: Any = lambda: True) -> bool:
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host.strip("[]"))  # noqa: S104
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection((target, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


class Command(BaseCommand):
    help = "Migrate, seed the demo, run Celery worker(s) with beat and the web server until Ctrl-C."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="Celery worker processes (AGENTRUN_WORKER_CONCURRENCY steps in flight each;"
            " the first runs beat)",
        )
        parser.add_argument("--no-demo", action="store_true", help="don't run the demo command")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["workers"] < 1:
            raise CommandError("--workers must be at least 1")
        host, port = opts["host"], opts["port"]
        if wait_for_port(host, port, timeout=0.5):
            raise CommandError(f"something is already listening on {host}:{port}; use --port")
        var_dir = Path(settings.VAR_DIR)
        var_dir.mkdir(parents=True, exist_ok=True)
        for folder in broker_folders():
            folder.mkdir(parents=True, exist_ok=True)

        db = settings.DATABASES["default"]
        self.stdout.write(f"database: {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}")
        self.stdout.write(f"broker:   {settings.CELERY_BROKER_URL.split('@')[-1]}")
        for line in registered():
            self.stdout.write(line)
        call_command("migrate", interactive=False, verbosity=1)
        has_demo = "demo" in get_commands() and not opts["no_demo"]
        if has_demo:
            call_command("demo", no_logins=True)  # the banner lists them
        elif not opts["no_demo"]:
            self.stderr.write(
                "warning: no `demo` command yet; starting without demo users and runs"
            )

        sup = Supervisor(
            [
                Child(name, argv)
                for name, argv in child_commands(host, port, opts["workers"], var_dir=var_dir)
            ],
            env=child_env(),
            cwd=str(settings.BASE_DIR),
            out=self.stdout,
        )
        previous = {s: signal.signal(s, sup.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            sup.start()
            web = sup.children[-1]
            # Generous: on a busy 2-core machine the imports alone can take a while.
            ready = wait_for_port(
                host, port, timeout=300, alive=lambda: web.alive and not sup.stopping
            )
            if ready:
                self._banner(host, port, has_demo)
            code = sup.watch()
        finally:
            sup.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        if code:
            raise CommandError("a child process died")

    def _banner(self, host: str, port: int, has_demo: bool) -> None:
        lines = ["", f"agentrun is up: {url_for(host, port)}"]
        if has_demo:
            lines.append("demo logins (username / password, role):")
            lines += [f"  {user} / {password}  ({role})" for user, role, password in demo_logins()]
        else:
            lines.append(
                "no demo users; add one: python manage.py adduser NAME --role admin --password PW"
            )
        lines += ["Ctrl-C stops everything.", ""]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
