"""Real Celery worker processes for the durability tests.

Each Worker is `celery -A agentrun worker` in its own process group, pointed
at the test database and the same broker as the test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return "sqlite:///" + str(Path(db["NAME"]).resolve())
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{auth}@{host}{port}/{db['NAME']}"


#: Why a test of a paused (SIGSTOPped) worker can't pass on RabbitMQ, or "".
PAUSED_ON_RABBITMQ = (
    "a paused worker keeps its AMQP connection (Celery's threads pool sends no AMQP"
    " heartbeats) and RabbitMQ keeps handing it messages until its consumer_timeout:"
    " see docs/operations/deployment.md"
    if settings.CELERY_BROKER_URL.startswith(("amqp", "pyamqp"))
    else ""
)


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="agentrun.settings",
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        AGENTRUN_VAR_DIR=str(settings.VAR_DIR),
        AGENTRUN_FAULTS="1",
        AGENTRUN_LEASE_SECONDS=str(settings.AGENTRUN_LEASE_SECONDS),
        AGENTRUN_RECONCILE_EVERY="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Worker:
    """One worker process with an optional embedded beat.

    Started as users start it: the pool and concurrency come from the Celery
    configuration (threads) unless `pool` / `concurrency` say otherwise.
    """

    count = 0

    def __init__(
        self,
        tmp_path: Path,
        *,
        concurrency: int | None = None,
        pool: str | None = None,
        beat: bool = False,
        prefix: list[str] | None = None,
        **env: str,
    ):
        """`prefix`: the command runs through it (e.g. `ip netns exec NAME`)."""
        Worker.count += 1
        self.name = f"w{Worker.count}"
        self.log_path = tmp_path / f"{self.name}.log"
        cmd = [
            *(prefix or []),
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentrun",
            "worker",
            *(["-P", pool] if pool else []),
            *(["-c", str(concurrency)] if concurrency else []),
            "-l",
            "info",
            "-n",
            f"{self.name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        if beat:
            cmd += ["-B", "--schedule", str(tmp_path / f"{self.name}-beat")]
        self.log = open(self.log_path, "w")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=worker_env(**env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_for_log("ready", timeout=60)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.name}: no {needle!r} in log:\n{self.text()[-3000:]}")

    def signal(self, sig: int) -> None:
        """Signal the whole process group: the main process and its pool children."""
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        # The whole group, even when the main process is gone: a worker that died (a
        # fault point's os._exit) leaves its embedded beat process behind otherwise.
        try:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        self.log.close()


def wait_until(
    check: Callable[[], Any], timeout: float = 60, interval: float = 0.1, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what or check}")


def decided(run: Any, number: int) -> Callable[[], bool]:
    """True once step `number` has its decision on record, i.e. its tool calls are about to run."""
    from agentrun.models import Step

    return lambda: Step.objects.filter(run=run, number=number, decision__isnull=False).exists()
