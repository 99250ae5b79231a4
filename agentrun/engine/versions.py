"""Code versions: which code executed a step, and which workers can execute a run.

A process's code version is `AGENTRUN_CODE_VERSION` when it is set (a release tag, a
commit); otherwise the deployment's commit, read from the project's `.git`, followed by a
hash of the registered agents' and tools' source (`<commit12>.<source8>`), or the source
hash alone (`src.<source12>`) where there is no `.git`. The source is read when the process
starts (`settle`), so a module edited on disk after the worker imported it does not change
what the worker says it runs.

Every worker consumes, besides the default queue, a queue of its own version: a run that
asks for a version (`Run.target_version`, a fork onto a version) is sent there and claimed
only by a worker of that version. Workers say they are alive in the `Worker` table, so a
run that waits for a version nobody runs says so instead of waiting silently.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import re
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from agentrun.agents import AGENTS
from agentrun.infra.queue import VERSION_QUEUE_PREFIX
from agentrun.models import Worker
from agentrun.tools import REGISTRY as TOOLS

log = logging.getLogger(__name__)

#: A version: 1-64 letters, digits and . _ + - (a tag, a commit, semver with build data).
VERSION_MAX_LENGTH = 64
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$"
_VERSION = re.compile(VERSION_PATTERN)


class InvalidVersion(ValueError):
    """Not a version string; the message says why."""


def check_version(value: Any) -> str:
    """The version as given, or InvalidVersion saying what is wrong with it."""
    if not isinstance(value, str):
        raise InvalidVersion("a version must be a string")
    if not value:
        raise InvalidVersion("a version can't be empty")
    if len(value) > VERSION_MAX_LENGTH:
        raise InvalidVersion(
            f"a version is at most {VERSION_MAX_LENGTH} characters; this one has {len(value)}"
        )
    if not _VERSION.match(value):
        raise InvalidVersion(
            "a version is letters, digits and . _ + - (starting with a letter or digit)"
        )
    return value


def queue_for(version: str) -> str:
    """The Celery queue that workers of `version` consume (besides the default one)."""
    return VERSION_QUEUE_PREFIX + version


_SETTLED: list[str] = []
_LOCK = threading.Lock()


def code_version() -> str:
    """This process's code version (settled at its first use, or by `settle`)."""
    if not _SETTLED:
        settle()
    return _SETTLED[0]


def settle() -> str:
    """Compute this process's code version now (at start-up, with its modules loaded)."""
    with _LOCK:
        if not _SETTLED:
            _SETTLED.append(_compute())
        return _SETTLED[0]


def _compute() -> str:
    given = settings.AGENTRUN_CODE_VERSION
    if given:
        return check_version(given)
    source = source_hash()
    commit = deployed_commit(Path(settings.BASE_DIR))
    return f"{commit[:12]}.{source[:8]}" if commit else f"src.{source[:12]}"


def source_hash() -> str:
    """A hash of the source of the modules that define the registered agents and tools."""
    modules = {type(agent).__module__ for agent in AGENTS.values()}
    modules |= {tool.fn.__module__ for tool in TOOLS.values()}
    digest = hashlib.sha256()
    for name in sorted(modules):
        module = sys.modules.get(name)
        try:
            text = inspect.getsource(module) if module is not None else name
        except (OSError, TypeError):
            text = name
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def deployed_commit(root: Path) -> str:
    """The commit checked out at `root` (its .git: HEAD, a loose ref or packed-refs), or ""."""
    git = root / ".git"
    if git.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = git.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return ""
        git = (root / text.split(":", 1)[1].strip()).resolve()
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return ""
    if not head.startswith("ref:"):
        return head if re.fullmatch(r"[0-9a-f]{40,64}", head) else ""
    ref = head.split(":", 1)[1].strip()
    for base in (git, _common_dir(git)):
        try:
            return (base / ref).read_text().strip()
        except OSError:
            pass
        try:
            for line in (base / "packed-refs").read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split(" ", 1)[0]
        except OSError:
            pass
    return ""


def _common_dir(git: Path) -> Path:
    try:
        return (git / (git / "commondir").read_text().strip()).resolve()
    except OSError:
        return git


# --- live workers ----------------------------------------------------------------------------


#: A worker says it is alive this often; it counts as alive for three times as long.
def heartbeat_seconds() -> float:
    return max(settings.AGENTRUN_WORKER_HEARTBEAT_SECONDS, 0.5)


def alive_after() -> Any:
    return timezone.now() - timedelta(seconds=3 * heartbeat_seconds())


def alive_workers() -> list[Worker]:
    return list(Worker.objects.filter(seen_at__gte=alive_after()).order_by("name"))


_ALIVE: list[Any] = [0.0, set()]  # when read (time.monotonic()), the versions


def versions_alive() -> set[str]:
    """The code versions of the live workers (read at most once a second per process)."""
    if time.monotonic() - _ALIVE[0] > 1.0:
        _ALIVE[1] = set(
            Worker.objects.filter(seen_at__gte=alive_after())
            .values_list("version", flat=True)
            .distinct()
        )
        _ALIVE[0] = time.monotonic()
    return _ALIVE[1]


def forget_versions_alive() -> None:
    _ALIVE[0] = 0.0


class Heartbeat:
    """A worker process's row in the Worker table, kept fresh by a thread of its own."""

    def __init__(self, name: str = "") -> None:
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.version = code_version()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        try:
            self.beat()
        finally:
            close_old_connections()  # the starting thread's connection goes back to the pool
        self._thread = threading.Thread(target=self._run, name="agentrun-heartbeat", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        now = timezone.now()
        Worker.objects.update_or_create(
            name=self.name,
            defaults={"version": self.version, "seen_at": now},
            create_defaults={"version": self.version, "seen_at": now, "started_at": now},
        )

    def _run(self) -> None:
        while not self._stop.wait(heartbeat_seconds()):
            try:
                self.beat()
            except Exception:  # the database is down: the next beat tries again
                log.warning("worker heartbeat failed", exc_info=True)
            finally:
                close_old_connections()

    def stop(self) -> None:
        self._stop.set()
        try:
            Worker.objects.filter(name=self.name).delete()
        except Exception:
            log.warning("could not remove this worker's row", exc_info=True)
        finally:
            close_old_connections()
