"""`manage.py up` (what `make up` runs) as a child process of a test, with its output in a file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BANNER = "agentrun is up: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell would have: none of the test run's own settings."""
    drop = ("PYTEST", "DATABASE_URL", "CELERY_BROKER_URL", "AGENTRUN_", "DJANGO_SETTINGS_MODULE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra)
    return env


class Up:
    """`python manage.py up --port PORT` started in ROOT, as `make up` starts it."""

    def __init__(self, log_path: Path, env: dict[str, str], port: int | None = None):
        self.port = port or free_port()
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(self.port)],
            cwd=ROOT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"up exited with {self.proc.returncode}:\n{self.text()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {needle!r} from up after {timeout}s:\n{self.text()[-4000:]}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """Ctrl-C, as a user stops it; it stops its children. Killed if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # its children get SIGTERM (PR_SET_PDEATHSIG)
                self.proc.wait(timeout=10)
        self.log.close()
