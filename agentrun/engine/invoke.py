"""Calling a tool: in the calling thread or a pool thread, within its timeout."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from agentrun.engine.context import Claimed, release_connection
from agentrun.engine.lease import WATCHDOG
from agentrun.tools import Tool, ToolContext, ToolError

_POOL: tuple[int, ThreadPoolExecutor] | None = None


_POOL_LOCK = threading.Lock()


def _tool_pool() -> ThreadPoolExecutor:
    """Threads for tool calls made off the main thread: as many as steps in flight
    (started on demand), so a slow tool never queues behind another run's."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            size = max(settings.AGENTRUN_WORKER_CONCURRENCY, 4) + 4
            _POOL = (os.getpid(), ThreadPoolExecutor(size, thread_name_prefix="agentrun-tool"))
        return _POOL[1]


class Abandoned(ToolError):
    """A tool call past its timeout in a thread that can't be stopped: it may still
    finish, so a side effect it was making is in doubt."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


def _in_pool(t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    """A tool call in a pool thread. The thread keeps its own database connection
    (a tool may use the ORM): check it as Django does around a request, so a
    connection broken by a database restart is replaced, not reused forever."""
    close_old_connections()
    try:
        return t(tctx, args)
    finally:
        close_old_connections()


def call_with_timeout(ctx: Claimed, t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    """Run the tool, keeping our lease while it works and stopping it at its timeout.

    In a process's main thread (a prefork or solo worker, the in-process executor)
    the tool runs right here: SIGALRM at its deadline raises a transient ToolError
    inside it, as Celery's soft time limit does, so a timed-out call is *stopped*.
    Other threads (the default threads pool) have no signals and Python can't stop
    a thread: there the tool runs in a pool thread that the step stops waiting for
    at the deadline. That call is *abandoned* (it may still finish): a read is
    retried, a side effect is in doubt unless its tool is idempotent. Either way the
    step holds no database connection while the tool works, and the lease watchdog
    renews its lease.
    """
    release_connection()
    with WATCHDOG.watching(ctx):
        if t.timeout <= 0:
            return t(tctx, args)
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
            return _with_alarm(t, tctx, args)
        future = _tool_pool().submit(_in_pool, t, tctx, args)
        try:
            return future.result(timeout=t.timeout)
        except FutureTimeout:
            raise Abandoned(
                f"{t.name} timed out after {t.timeout:g}s and was abandoned (it may still finish)"
            ) from None


def _timed_out(t: Tool) -> ToolError:
    return ToolError(f"{t.name} timed out after {t.timeout:g}s", transient=True)


def _with_alarm(t: Tool, tctx: ToolContext, args: dict[str, Any]) -> Any:
    def alarm(signum: int, frame: Any) -> None:
        raise _timed_out(t)

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, t.timeout)
    try:
        return t(tctx, args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
