"""End to end through real Celery worker processes on Redis.

Workers are `celery -A agentrun worker` processes started here (each in its own
process group, stopped by its pid), with AGENTRUN_AGENT_MODULES=bench.agent and
BENCH_TIMING_REDIS set, so each execute_step task pushes its start and end times
(the end is after the commit returned) to the Redis list "bench:steps".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import env
from bench.stats import steps_summary
from bench.wl import ROOT

TIMING_KEY = "bench:steps"


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(env.BROKER_URL)


class Worker:
    """One worker process, prefork pool of `concurrency` children."""

    def __init__(self, name: str, concurrency: int = 1):
        self.name = name
        self.log_path = env.OUT / f"worker-{name}.log"
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentrun",
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-l",
            "info",
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        worker_env = {
            **os.environ,
            **env.environment(),
            "AGENTRUN_ENQUEUE": "1",
            "BENCH_TIMING_REDIS": env.BROKER_URL,
            "PYTHONUNBUFFERED": "1",
        }
        self.log = open(self.log_path, "w")  # noqa: SIM115 — closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=worker_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(timeout=90)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in Path(self.log_path).read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        tail = Path(self.log_path).read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"worker {self.name} did not start:\n{tail}")

    def stop(self) -> None:
        """Warm shutdown (SIGTERM to its process group), then SIGKILL after 30 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        self.log.close()


class Workers:
    def __init__(self, count: int):
        self.workers: list[Worker] = []
        try:
            for i in range(count):
                self.workers.append(Worker(f"bench{i + 1}"))
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def reset_broker() -> None:
    """Redis db 7 is the bench's own: empty it (queue, unacked messages, timings)."""
    redis_client().flushdb()


def timings(run_ids: set[str] | None = None) -> list[list[Any]]:
    rows = [json.loads(x) for x in redis_client().lrange(TIMING_KEY, 0, -1)]
    return [r for r in rows if run_ids is None or r[0] in run_ids]


def wait_finished(run_ids: list[Any], deadline: float, poll: float = 0.25) -> None:
    from agentrun.models import ACTIVE_STATUSES, Run

    while True:
        active = Run.objects.filter(pk__in=run_ids, status__in=ACTIVE_STATUSES).count()
        if not active:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{active} run(s) still active at the time budget")
        time.sleep(poll)


def e2e_repeat(variant: str, n: int, budget_s: float) -> dict[str, Any]:
    """One workload run through the worker; per-step latency from commit to commit."""
    from django.conf import settings

    from agentrun import services, snapshots
    from agentrun.models import Run
    from bench.measure import check_state, inputs

    env.truncate()
    redis_client().delete(TIMING_KEY)
    settings.AGENTRUN_ENQUEUE = True
    try:
        t_created = time.time()
        run = services.start_run("workload", inputs(variant, n))
        t_created = (t_created + time.time()) / 2
        out: dict[str, Any] = {"variant": variant, "n": n}
        try:
            wait_finished([run.pk], time.monotonic() + budget_s)
        except TimeoutError as exc:
            out["aborted"] = str(exc)
            services.cancel_run(Run.objects.get(pk=run.pk), reason="bench time budget")
            return out
    finally:
        settings.AGENTRUN_ENQUEUE = False
    run.refresh_from_db()
    assert run.status == "succeeded", (run.status, run.error)
    rows = sorted(
        (r for r in timings({str(run.pk)}) if r[2] in ("committed", "finished")), key=lambda r: r[1]
    )
    assert [r[1] for r in rows] == list(range(1, n + 2)), "a step ran twice or not at all"
    ends = [r[4] for r in rows[:n]]
    c2c = [(b - a) * 1000 for a, b in zip(ends, ends[1:], strict=False)]  # steps 2..n
    out["commit_to_commit"] = steps_summary(c2c)
    out["first_step"] = (ends[0] - t_created) * 1000
    out["task_ms"] = steps_summary([(r[4] - r[3]) * 1000 for r in rows[1:n]])
    out["task_cpu_ms"] = steps_summary([r[6] for r in rows[1:n]])
    out["queue_gap_ms"] = steps_summary([(rows[i][3] - rows[i - 1][4]) * 1000 for i in range(1, n)])
    out["fingerprint_final"] = check_state(
        snapshots.load(run.pk, n, "post"), variant, n, "final state through Celery"
    )
    return out


def scripted_input(steps: int) -> dict[str, Any]:
    script: list[dict[str, Any]] = [
        {"thought": f"echo {i}", "calls": [{"tool": "echo", "args": {"i": i}}]}
        for i in range(steps)
    ]
    script.append({"thought": "done", "final": "ok"})
    return {"goal": "bench throughput", "steps": script}


def throughput(workers: int, runs: int, steps: int, budget_s: float) -> dict[str, Any]:
    """Trivial steps per second: `runs` concurrent scripted runs of echo steps."""
    from django.conf import settings

    from agentrun import services

    env.truncate()
    redis_client().delete(TIMING_KEY)
    with Workers(workers):
        settings.AGENTRUN_ENQUEUE = True
        try:
            ids = [services.start_run("scripted", scripted_input(steps)).pk for _ in range(runs)]
            wait_finished(ids, time.monotonic() + budget_s)
        finally:
            settings.AGENTRUN_ENQUEUE = False
    rows = timings({str(i) for i in ids})
    done = [r for r in rows if r[2] in ("committed", "finished")]
    statuses = Counter(r[2] for r in rows)
    expected = runs * (steps + 1)
    assert len(done) == expected, f"{len(done)} committed steps, expected {expected}: {statuses}"
    span = max(r[4] for r in done) - min(r[3] for r in done)
    return {
        "workers": workers,
        "runs": runs,
        "steps": len(done),
        "seconds": span,
        "steps_per_s": len(done) / span,
        "statuses": dict(statuses),
        "pids": len({r[5] for r in rows}),
    }
