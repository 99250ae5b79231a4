"""End to end through real Celery worker processes on Redis.

Workers are `celery -A agentrun worker` processes started here (each in its own
process group, stopped by its pid), with AGENTRUN_AGENT_MODULES=bench.agent and
BENCH_TIMING_REDIS set, so each execute_step task pushes its start and end times
(the end is after the commit returned) to the Redis list "bench:steps".

A task may run a chain of its run's steps (AGENTRUN_CHAIN_SECONDS, see agentrun/tasks.py):
commit times come from the steps' rows (Step.finished_at), per-task figures from the
signals, divided by the steps each task ran. Export AGENTRUN_CHAIN_SECONDS=0 to measure
one task per step.

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

from celery import shared_task

from bench import env
from bench.stats import steps_summary
from bench.wl import ROOT

TIMING_KEY = "bench:steps"
PHASES_KEY = "bench:phases"
# The pool flags of every worker started here (production's, see README).
WORKER_ARGS = ["-P", "prefork", "-c", "1", "-l", "info"]


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
            # This module too: it says when the worker is ready, whatever its log level.
            "AGENTRUN_AGENT_MODULES": "bench.agent,bench.celery_bench",
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


def _on_worker_ready(**_: Any) -> None:
    print("bench: worker ready.", flush=True)


if os.environ.get("BENCH_TIMING_REDIS"):
    from celery.signals import worker_ready

    worker_ready.connect(_on_worker_ready, weak=False)

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

    from agentrun.lifecycle import services
    from agentrun.models import Run, Step
    from agentrun.store import snapshots
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
    steps = list(
        Step.objects.filter(run=run)
        .order_by("number")
        .values_list("number", "attempts", "finished_at")
    )
    assert [s[0] for s in steps] == list(range(1, n + 2)), "a step is missing"
    assert all(s[1] == 1 for s in steps), "a step was claimed twice"
    # Commit times from the steps' rows: a task may run a chain of steps.
    ends = [s[2].timestamp() for s in steps[:n]]
    c2c = [(b - a) * 1000 for a, b in zip(ends, ends[1:], strict=False)]  # steps 2..n
    out["commit_to_commit"] = steps_summary(c2c)
    out["first_step"] = (ends[0] - t_created) * 1000
    rows = [r for r in timings({str(run.pk)}) if r[2] != "not_claimed"]
    out.update(_per_task(rows, {str(run.pk): n + 1}))
    if os.environ.get("BENCH_PHASES"):
        out["phases"] = phases(str(run.pk), sorted(rows, key=lambda r: r[1]))
    if workers:
        out["worker_cpu_ms_per_step"] = (workers.cpu_s() - cpu0) * 1000 / (n + 1)
    out["fingerprint_final"] = check_state(
        snapshots.load(run.pk, n, "post"), variant, n, "final state through Celery"
    )
    return out


def _per_task(rows: list[list[Any]], last_step: dict[str, int]) -> dict[str, Any]:
    """Per-task figures, per step: a task runs its run's steps from rows[i][1] on, until
    the next task of the run takes over (AGENTRUN_CHAIN_SECONDS)."""
    by_run: dict[str, list[list[Any]]] = {}
    for r in rows:
        by_run.setdefault(r[0], []).append(r)
    per_step, cpu, gaps, lengths = [], [], [], []
    for run_id, tasks in by_run.items():
        tasks.sort(key=lambda r: r[1])
        firsts = [r[1] for r in tasks] + [last_step[run_id] + 1]
        for i, r in enumerate(tasks):
            k = firsts[i + 1] - firsts[i]
            lengths.append(k)
            per_step.append((r[4] - r[3]) * 1000 / k)
            cpu.append(r[6] / k)
            if i:
                gaps.append((r[3] - tasks[i - 1][4]) * 1000)
    out: dict[str, Any] = {
        "tasks": len(rows),
        "steps_per_task": steps_summary(lengths),
        "task_ms": steps_summary(per_step),
        "task_cpu_ms": steps_summary(cpu),
    }
    if gaps:
        out["queue_gap_ms"] = steps_summary(gaps)
    return out


def scripted_input(steps: int) -> dict[str, Any]:
    script: list[dict[str, Any]] = [
        {"thought": f"echo {i}", "calls": [{"tool": "echo", "args": {"i": i}}]}
        for i in range(steps)
    ]
    script.append({"thought": "done", "final": "ok"})
    return {"goal": "bench throughput", "steps": script}


NOOP_KEY = "bench:noop"


@shared_task(name="bench.noop_chain")
def noop_chain(k: int, n: int) -> None:
    """Celery alone: each task publishes the next, as a step does after its commit."""
    if k < n:
        noop_chain.apply_async((k + 1, n))
    from bench.agent import _client

    _client().rpush(NOOP_KEY, json.dumps([k, time.time(), time.process_time()]))


def noop_repeat(n: int, workers: Workers, budget_s: float) -> dict[str, Any]:
    """A chain of n no-op tasks through the same workers: what Celery costs per step."""
    client = redis_client()
    client.delete(NOOP_KEY)
    cpu0 = workers.cpu_s()
    noop_chain.delay(1, n)
    deadline = time.monotonic() + budget_s
    while client.llen(NOOP_KEY) < n:
        if time.monotonic() > deadline:
            return {"n": n, "aborted": f"{client.llen(NOOP_KEY)} of {n} no-op tasks ran"}
        time.sleep(0.05)
    cpu_s = workers.cpu_s() - cpu0
    rows = sorted(json.loads(x) for x in client.lrange(NOOP_KEY, 0, -1))
    ends = [r[1] for r in rows]
    return {
        "n": n,
        "task_to_task": steps_summary(
            [(b - a) * 1000 for a, b in zip(ends, ends[1:], strict=False)]
        ),
        "worker_cpu_ms_per_task": cpu_s * 1000 / n,
    }


def throughput(workers: int, runs: int, steps: int, budget_s: float) -> dict[str, Any]:
    """Trivial steps per second: `runs` concurrent scripted runs of echo steps."""

    from agentrun.lifecycle import services
    from agentrun.models import Step
    from agentrun.tasks import execute_step_task

    env.truncate()
    redis_client().delete(TIMING_KEY)
    # The runs exist before their first messages go out together: the workers, not
    # this process creating runs one by one, set the pace.
    ids = [services.start_run("scripted", scripted_input(steps)).pk for _ in range(runs)]
    with Workers(workers) as started:
        cpu0 = started.cpu_s()
        for pk in ids:
            execute_step_task.delay(str(pk), 1)
        wait_finished(ids, time.monotonic() + budget_s)
        cpu_s = started.cpu_s() - cpu0
    rows = timings({str(i) for i in ids})
    statuses = Counter(r[2] for r in rows)
    committed = Step.objects.filter(run__in=ids, status="succeeded").count()
    expected = runs * (steps + 1)
    assert committed == expected, f"{committed} committed steps, expected {expected}: {statuses}"
    span = max(r[4] for r in rows) - min(r[3] for r in rows)
    per_task = _per_task(
        [r for r in rows if r[2] != "not_claimed"], {str(i): steps + 1 for i in ids}
    )
    return {
        "workers": workers,
        "runs": runs,
        "steps": committed,
        "seconds": span,
        "steps_per_s": committed / span,
        "statuses": dict(statuses),
        "pids": len({r[5] for r in rows}),
        "worker_cpu_ms_per_step": cpu_s * 1000 / committed,
        **per_task,
    }


def main() -> int:
    p = argparse.ArgumentParser(description="Only the worker cases of bench/run.py.")
    p.add_argument(
        "--e2e", default="grow:200", help="variant:N,... for commit→commit ('' for none)"
    )
    p.add_argument("--repeats", type=int, default=1, help="repeats of each --e2e case")
    p.add_argument("--noop", type=int, default=0, help="also a chain of this many no-op tasks")
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
        if cases or args.noop:
            with Workers(1) as workers:
                for _ in range(args.repeats if args.noop else 0):
                    rep = noop_repeat(args.noop, workers, args.budget)
                    results.setdefault("noop", []).append(rep)
                    t = rep.get("task_to_task", {})
                    print(
                        f"no-op chain N={args.noop}: task→task {t.get('median', 0):.2f} ms "
                        f"(p10 {t.get('p10', 0):.2f}, p90 {t.get('p90', 0):.2f}), "
                        f"worker CPU {rep.get('worker_cpu_ms_per_task', 0):.2f} ms/task "
                        f"{rep.get('aborted', '')}",
                        flush=True,
                    )
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
                f"({tp['steps']} steps in {tp['seconds']:.2f} s); {_brief_tasks(tp)}",
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
    c = rep["commit_to_commit"]
    return (
        f"{rep['variant']} N={rep['n']}: commit→commit {c['median']:.2f} ms "
        f"(p10 {c['p10']:.2f}, p90 {c['p90']:.2f}); {_brief_tasks(rep)}"
    )


def _brief_tasks(rep: dict[str, Any]) -> str:
    gap = rep.get("queue_gap_ms", {}).get("median")
    return (
        f"{rep['tasks']} tasks of {rep['steps_per_task']['median']:.0f} steps, per step in the "
        f"task {rep['task_ms']['median']:.2f} ms (CPU {rep['task_cpu_ms']['median']:.2f}), "
        f"queue gap {'-' if gap is None else f'{gap:.2f} ms'}, "
        f"worker CPU {rep.get('worker_cpu_ms_per_step', 0):.2f} ms/step"
    )


if __name__ == "__main__":
    sys.exit(main())
