"""End to end through real Celery worker processes on Redis.

Workers are `celery -A agentrun worker` processes started here (each in its own
process group, stopped by its pid), with AGENTRUN_AGENT_MODULES=bench.agent and
BENCH_TIMING_REDIS set, so each execute_step task pushes its start and end times
(the end is after the commit returned) to the Redis list "bench:steps".

Run on its own (only the worker cases, nothing in-process):

    .venv/bin/python -m bench.celery_bench --e2e grow:200 --repeats 2 --throughput 1,2

BENCH_WORKER_ARGS (space-separated) replaces the pool flags of WORKER_ARGS, to compare
worker command lines. With --phases the workers also load this module, which then
splits the gap between two steps of a run (BENCH_PHASES, Redis list "bench:phases"):
the next step's message published (on the commit, in the pool process), its task
received by the worker's consumer process, and started in a pool process. The extra
Redis pushes cost a little time themselves: compare figures taken the same way.
"""

from __future__ import annotations

import argparse
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
PHASES_KEY = "bench:phases"
# The pool flags of every worker started here (production's, see README).
WORKER_ARGS = ["-P", "prefork", "-c", "1"]


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(env.BROKER_URL)


class Worker:
    """One worker process (WORKER_ARGS: its pool and concurrency)."""

    def __init__(self, name: str):
        self.name = name
        self.log_path = env.OUT / f"worker-{name}.log"
        pool = os.environ.get("BENCH_WORKER_ARGS", "").split() or WORKER_ARGS
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "agentrun",
            "worker",
            *pool,
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
            **(
                {"AGENTRUN_AGENT_MODULES": "bench.agent,bench.celery_bench"}
                if os.environ.get("BENCH_PHASES")
                else {}
            ),
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

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the worker's process group so far."""
        return _group_cpu_s(self.proc.pid)

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

    def cpu_s(self) -> float:
        return sum(w.cpu_s() for w in self.workers)


def _group_cpu_s(pgid: int) -> float:
    """utime + stime of the live processes of a process group (+ reaped children)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[0] is the state: pgrp is the 5th field
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


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


def _push_phase(kind: str, run_id: Any, step: Any) -> None:
    from bench.agent import _client

    _client().rpush(PHASES_KEY, json.dumps([kind, str(run_id), int(step), time.time()]))


def _on_published(sender: str = "", body: Any = None, **_: Any) -> None:
    if sender == "agentrun.execute_step":
        _push_phase("published", *body[0])


def _on_received(request: Any = None, **_: Any) -> None:
    if request is not None and request.name == "agentrun.execute_step":
        _push_phase("received", *request.args)


if os.environ.get("BENCH_PHASES") and os.environ.get("BENCH_TIMING_REDIS"):
    from celery.signals import after_task_publish, task_received

    after_task_publish.connect(_on_published, weak=False)
    task_received.connect(_on_received, weak=False)


def phases(run_id: str, rows: list[list[Any]]) -> dict[str, Any]:
    """Split each gap between steps k and k+1 of a run (see the module docstring)."""
    marks: dict[tuple[str, int], float] = {}
    for kind, rid, step, t in (json.loads(x) for x in redis_client().lrange(PHASES_KEY, 0, -1)):
        if rid == run_id:
            marks.setdefault((kind, step), t)
    parts: dict[str, list[float]] = {
        "publish→task end": [],
        "publish→received": [],
        "task end→received": [],
        "received→started": [],
    }
    for prev, row in zip(rows, rows[1:], strict=False):
        step, end, start = row[1], prev[4], row[3]
        pub, recv = marks.get(("published", step)), marks.get(("received", step))
        if pub is None or recv is None:
            continue
        parts["publish→task end"].append((end - pub) * 1000)
        parts["publish→received"].append((recv - pub) * 1000)
        parts["task end→received"].append((recv - end) * 1000)
        parts["received→started"].append((start - recv) * 1000)
    return {k: steps_summary(v) for k, v in parts.items() if v}


def e2e_repeat(
    variant: str, n: int, budget_s: float, workers: Workers | None = None
) -> dict[str, Any]:
    """One workload run through the worker; per-step latency from commit to commit.

    With `workers`, also the CPU time their processes spent per step (all of it: the
    pool's children and the consumer process that talks to the broker).
    """
    from django.conf import settings

    from agentrun import services, snapshots
    from agentrun.models import Run
    from bench.measure import check_state, inputs

    env.truncate()
    redis_client().delete(TIMING_KEY, PHASES_KEY)
    settings.AGENTRUN_ENQUEUE = True
    cpu0 = workers.cpu_s() if workers else 0.0
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
    if os.environ.get("BENCH_PHASES"):
        out["phases"] = phases(str(run.pk), rows[: n + 1])
    if workers:
        out["worker_cpu_ms_per_step"] = (workers.cpu_s() - cpu0) * 1000 / (n + 1)
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
    with Workers(workers) as started:
        settings.AGENTRUN_ENQUEUE = True
        cpu0 = started.cpu_s()
        try:
            ids = [services.start_run("scripted", scripted_input(steps)).pk for _ in range(runs)]
            wait_finished(ids, time.monotonic() + budget_s)
        finally:
            settings.AGENTRUN_ENQUEUE = False
        cpu_s = started.cpu_s() - cpu0
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
        "worker_cpu_ms_per_step": cpu_s * 1000 / len(done),
        "task_ms": steps_summary([(r[4] - r[3]) * 1000 for r in done]),
        "task_cpu_ms": steps_summary([r[6] for r in done]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description="Only the worker cases of bench/run.py.")
    p.add_argument(
        "--e2e", default="grow:200", help="variant:N,... for commit→commit ('' for none)"
    )
    p.add_argument("--repeats", type=int, default=1, help="repeats of each --e2e case")
    p.add_argument("--throughput", default="1,2", help="worker process counts ('' for none)")
    p.add_argument("--runs", type=int, default=100, help="concurrent scripted runs")
    p.add_argument("--steps", type=int, default=5, help="echo steps per scripted run")
    p.add_argument("--budget", type=float, default=900.0, help="seconds per case")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--phases", action="store_true", help="split the gap between steps")
    args = p.parse_args()
    if args.phases:
        os.environ["BENCH_PHASES"] = "1"

    env.setup()
    print("worker:", " ".join(os.environ.get("BENCH_WORKER_ARGS", "").split() or WORKER_ARGS))
    results: dict[str, Any] = {"e2e": [], "throughput": []}
    reset_broker()
    try:
        cases = [c.split(":") for c in args.e2e.split(",") if c]
        if cases:
            with Workers(1) as workers:
                for variant, n in cases:
                    for _ in range(args.repeats):
                        rep = e2e_repeat(variant, int(n), args.budget, workers)
                        results["e2e"].append(rep)
                        print(_brief_e2e(rep), flush=True)
                        for name, ph in rep.get("phases", {}).items():
                            print(f"    {name}: {ph['median']:.2f} ms (p90 {ph['p90']:.2f})")
        for count in (int(x) for x in args.throughput.split(",") if x):
            reset_broker()
            tp = throughput(count, args.runs, args.steps, args.budget)
            results["throughput"].append(tp)
            print(
                f"throughput {count} worker(s): {tp['steps_per_s']:.1f} steps/s "
                f"({tp['steps']} steps in {tp['seconds']:.2f} s), task {tp['task_ms']['median']:.2f} ms "
                f"(CPU {tp['task_cpu_ms']['median']:.2f}), worker CPU {tp['worker_cpu_ms_per_step']:.2f} ms/step",
                flush=True,
            )
    finally:
        reset_broker()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _brief_e2e(rep: dict[str, Any]) -> str:
    if "commit_to_commit" not in rep:
        return f"{rep['variant']} N={rep['n']}: {rep.get('aborted', '?')}"
    return (
        f"{rep['variant']} N={rep['n']}: commit→commit {rep['commit_to_commit']['median']:.2f} ms "
        f"(p10 {rep['commit_to_commit']['p10']:.2f}, p90 {rep['commit_to_commit']['p90']:.2f}), "
        f"task {rep['task_ms']['median']:.2f} ms (CPU {rep['task_cpu_ms']['median']:.2f}), "
        f"queue gap {rep['queue_gap_ms']['median']:.2f} ms, "
        f"worker CPU {rep.get('worker_cpu_ms_per_step', 0):.2f} ms/step"
    )


if __name__ == "__main__":
    sys.exit(main())
