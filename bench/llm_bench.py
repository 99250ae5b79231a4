"""LLM-bound runs through real worker processes, against a local fake LLM.

    .venv/bin/python bench/llm_bench.py --runs 100 1000 10000 --latency 1.0

Each case starts `--workers` processes with the default worker command
(`python -m celery -A agentrun worker -l info`, no pool or concurrency flags: those
come from the settings and the environment, plus `--env K=V`), on PostgreSQL
(`BENCH_DATABASE_URL`, default the database agentrun_bench) and Redis
(`BENCH_BROKER_URL`, default db 3, which it empties). Their LLM is bench/fake_llm.py,
started here: each `llm` run asks it three times (echo, echo, answer), each answer
after `--latency` seconds, so a run ideally takes 3 × latency.

The runs of a case are created first, with no wake-up; the clock starts when their
messages go out together, and the workers set the pace from there. Meanwhile a thread
polls PostgreSQL's connections held by the workers (pg_stat_activity, by the
application name the workers get through PGAPPNAME) every 100 ms and the workers' RSS.
The first case is the CPU-bound floor: `scripted` runs of echo steps through the same
workers, whose steps/s the LLM cases are compared with.

It prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: bench/ is sys.path[0], not the repository
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentrun_bench")
os.environ.setdefault("BENCH_BROKER_URL", "redis://127.0.0.1:6379/3")

from bench import env  # noqa: E402  (after the defaults above: it reads them on import)
from bench.report import machine  # noqa: E402

APP_NAME = "agentrun-bench-worker"
LLM_GOAL = "echo twice then answer"
WORKER_CMD = [sys.executable, "-m", "celery", "-A", "agentrun", "worker", "-l", "info"]
# Lines of a worker log that count as errors (Celery's "ERROR/MainProcess", Django's
# "... ERROR name ...", uncaught tracebacks).
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")
WARNING_LINE = re.compile(r"\bWARNING\b")
MB = 1024 * 1024
PUBLISH_BATCH = 50  # wake-ups per Redis round trip

# Targets.
TARGET_1000_SECONDS = 8.0
TARGET_PG_CONNECTIONS = 20
TARGET_RSS_BYTES = 1024 * MB
TARGET_FLOOR_SHARE = 0.5


# --- the fake LLM --------------------------------------------------------------


class FakeLLMServer:
    """bench/fake_llm.py in its own process (and process group)."""

    def __init__(self, latency: float, rate_limited: float, retry_after: float):
        cmd = [
            sys.executable,
            str(ROOT / "bench" / "fake_llm.py"),
            f"--latency={latency}",
            f"--rate-limited={rate_limited}",
            f"--retry-after={retry_after}",
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"fake_llm did not start: {line!r}")
        self.base_url = line.split()[-1]  # http://127.0.0.1:PORT/v1
        self.root = self.base_url.removesuffix("/v1")

    def stats(self, reset: bool = False) -> dict[str, Any]:
        req = urllib.request.Request(
            self.root + ("/stats/reset" if reset else "/stats"),
            method="POST" if reset else "GET",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        _stop_group(self.proc, grace=5)


# --- workers -------------------------------------------------------------------


def worker_environment(base_url: str, extra: dict[str, str]) -> dict[str, str]:
    """The bench's database and broker, the fake LLM, and only the defaults otherwise."""
    out = {**os.environ, **env.environment()}
    for name in ("LOG_LEVEL", "AGENTRUN_AGENT_MODULES"):  # the bench's own choices
        out.pop(name, None)
    out.update(
        AGENTRUN_ENQUEUE="1",
        AGENTRUN_LLM_BASE_URL=base_url,
        AGENTRUN_LLM_API_KEY="bench-key",
        PGAPPNAME=APP_NAME,
        PYTHONUNBUFFERED="1",
    )
    out.update(extra)
    return out


class Workers:
    """`count` worker processes, each in its own process group, logging to a file."""

    def __init__(self, count: int, environment: dict[str, str], case: str, deadline: float):
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.marks: list[int] | None = None
        # A profiled worker (AGENTRUN_PROFILE_PATH, agentrun/celery.py) merges its
        # threads' profiles as it shuts down: a minute or more.
        self.grace = 300 if environment.get("AGENTRUN_PROFILE_PATH") else 30
        try:
            for i in range(count):
                log_path = env.OUT / f"llm-{case}-worker{i + 1}.log"
                with open(log_path, "wb") as log:
                    cmd = [*WORKER_CMD, "-n", f"llmbench{i + 1}@%h"]
                    self.procs.append(
                        subprocess.Popen(
                            cmd,
                            cwd=ROOT,
                            env=environment,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
                self.logs.append(log_path)
            self._wait_ready(min(deadline, time.monotonic() + 120))
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline: float) -> None:
        """Until each worker says "ready." in its log (at log level INFO) or answers a
        ping (whatever its log level)."""
        from agentrun.celery import app

        pending = {f"llmbench{i + 1}@{socket.gethostname()}": i for i in range(len(self.procs))}
        while pending:
            for name, i in list(pending.items()):
                if " ready." in self.logs[i].read_text(errors="replace"):
                    del pending[name]
                elif self.procs[i].poll() is not None or time.monotonic() > deadline:
                    tail = self.logs[i].read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"worker {i + 1} did not start:\n{tail}")
            if pending:
                for reply in app.control.ping(destination=list(pending), timeout=0.3) or []:
                    for name in reply:
                        pending.pop(name, None)

    @property
    def pgids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def stop(self) -> None:
        """Warm shutdown: SIGTERM to each worker's main process (it stops its pool)."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            _stop_group(p, grace=self.grace)

    def mark(self) -> None:
        """The end of the measured window: log lines after it are the shutdown's."""
        self.marks = [path.stat().st_size for path in self.logs]

    def log_lines(self) -> tuple[list[str], list[str]]:
        """The logs' lines up to mark(), and after it."""
        during: list[str] = []
        after: list[str] = []
        for i, path in enumerate(self.logs):
            data = path.read_bytes()
            mark = len(data) if self.marks is None else self.marks[i]
            during += data[:mark].decode(errors="replace").splitlines()
            after += data[mark:].decode(errors="replace").splitlines()
        return during, after


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def _stop_group(proc: subprocess.Popen[Any], grace: float) -> None:
    """Wait `grace` s for the process to exit, then SIGKILL its whole process group."""
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=30)
    # A pool child may outlive its parent for a moment: nothing of the group stays.
    if group_pids({proc.pid}):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


# --- /proc -----------------------------------------------------------------------


def group_pids(pgids: set[int]) -> list[int]:
    """The live processes whose process group is one of `pgids`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids:  # fields[0] is the state, [2] the process group
            pids.append(int(stat.parent.name))
    return pids


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def _proc_cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgids: set[int]) -> float:
    """utime + stime (and reaped children's) of the live processes of the groups."""
    return sum(_proc_cpu_s(pid) for pid in group_pids(pgids))


class Monitor(threading.Thread):
    """Every 100 ms the workers' PostgreSQL connections, every 300 ms their RSS, and
    once a second a line of the case's timeline (also messages waiting in Redis and
    requests in flight at the fake LLM)."""

    def __init__(self, pgids: set[int], server: FakeLLMServer, interval: float = 0.1):
        super().__init__(name="llm-bench-monitor", daemon=True)
        self.pgids, self.server, self.interval = pgids, server, interval
        self.peak_pg = self.peak_pg_busy = self.peak_rss = self.peak_queue = self.samples = 0
        self.rss = self.rss_start = rss_bytes(group_pids(pgids))
        self.timeline: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        import redis

        broker = redis.Redis.from_url(env.BROKER_URL)
        t0 = time.monotonic()
        with env.raw(autocommit=True) as conn:
            while not self._stop_event.wait(self.interval):
                total, busy = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    (APP_NAME,),
                ).fetchone()
                self.peak_pg = max(self.peak_pg, total)
                self.peak_pg_busy = max(self.peak_pg_busy, busy)
                if self.samples % 3 == 0:
                    self.rss = rss_bytes(group_pids(self.pgids))
                    self.peak_rss = max(self.peak_rss, self.rss)
                if self.samples % 10 == 0:
                    queue = broker.llen("celery")  # Celery's default queue
                    self.peak_queue = max(self.peak_queue, queue)
                    self.timeline.append(
                        {
                            "t": round(time.monotonic() - t0, 1),
                            "pg": total,
                            "pg_busy": busy,
                            "queued_in_redis": queue,
                            "llm_in_flight": self.server.stats()["in_flight"],
                            "rss_mb": round(self.rss / MB),
                        }
                    )
                self.samples += 1

    def finish(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join(timeout=10)
        return {
            "peak_pg_connections": self.peak_pg,
            "peak_pg_connections_busy": self.peak_pg_busy,
            "peak_rss_bytes": self.peak_rss,
            "rss_at_start_bytes": self.rss_start,
            "peak_queued_in_redis": self.peak_queue,
            "monitor_samples": self.samples,
            "timeline": self.timeline,
        }


# --- one case --------------------------------------------------------------------


def llm_input() -> dict[str, Any]:
    return {"goal": LLM_GOAL, "tools": ["echo"]}


def scripted_input(steps: int) -> dict[str, Any]:
    script: list[dict[str, Any]] = [
        {"thought": f"echo {i}", "calls": [{"tool": "echo", "args": {"text": f"turn {i}"}}]}
        for i in range(steps)
    ]
    script.append({"thought": "done", "final": "ok"})
    return {"goal": "CPU-bound floor", "steps": script}


def reset_state() -> None:
    """Fresh tables and an empty broker db: nothing of a previous case is left."""
    import redis

    env.truncate()
    redis.Redis.from_url(env.BROKER_URL).flushdb()


def create_runs(agent: str, make_input: Callable[[], Any], n: int, deadline: float) -> list[str]:
    """n runs, no wake-up sent (AGENTRUN_ENQUEUE is off in this process), committed
    without waiting for the WAL flush: creating them is not what is measured."""
    from django.db import connection

    from agentrun.lifecycle import services
    from agentrun.models import Run

    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit TO off")
    ids = []
    for _ in range(n):
        ids.append(str(services.start_run(agent, make_input()).pk))
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(ids)} of {n} runs created within the time budget")
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit TO on")
    found = Run.objects.count()
    if found != n:
        raise RuntimeError(f"{found} runs in the database after creating {n}")
    return ids


def publish(ids: list[str]) -> tuple[float, float]:
    """One wake-up per run for its step 1; returns (clock start, publishing seconds)."""
    from agentrun.celery import app
    from agentrun.tasks import execute_step_task

    t0 = time.time()
    # One producer (~25% less time per message), and kombu's publish batches: Redis
    # gets the messages 50 at a time in a pipeline (~30% less CPU per message, and
    # the publisher shares the cores with the workers it is timing).
    with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
        for pk in ids:
            execute_step_task.apply_async((pk, 1), producer=producer)
    return t0, time.time() - t0


def wait_done(deadline: float, poll: float = 0.25) -> int:
    """Active runs left when all finished (0) or at the deadline."""
    from agentrun.models import ACTIVE_STATUSES, Run

    while True:
        active = Run.objects.filter(status__in=ACTIVE_STATUSES).count()
        if not active or time.monotonic() > deadline:
            return active
        time.sleep(poll)


def run_case(
    name: str,
    agent: str,
    make_input: Callable[[], Any],
    n: int,
    args: argparse.Namespace,
    server: FakeLLMServer,
    environment: dict[str, str],
) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + args.timeout
    reset_state()
    out: dict[str, Any] = {"case": name, "agent": agent, "runs": n}
    ids = create_runs(agent, make_input, n, deadline)
    out["create_s"] = time.monotonic() - started
    workers = Workers(args.workers, environment, name, deadline)
    try:
        out["worker_processes"] = len(group_pids(workers.pgids))
        server.stats(reset=True)
        monitor = Monitor(workers.pgids, server)
        monitor.start()
        cpu0, server_cpu0 = group_cpu_s(workers.pgids), server.cpu_s()
        t0, out["publish_s"] = publish(ids)
        out["active_left"] = wait_done(deadline)
        out["worker_cpu_s"] = group_cpu_s(workers.pgids) - cpu0
        out["llm_server_cpu_s"] = server.cpu_s() - server_cpu0
        out.update(monitor.finish())
        out["llm_server"] = server.stats()
        workers.mark()
    finally:
        workers.stop()
    out.update(run_figures(t0, n))
    out.update(log_figures(*workers.log_lines()))
    out["wall_s"] = time.monotonic() - started
    reset_state()
    return out


def run_figures(t0: float, n: int) -> dict[str, Any]:
    """From the database: when the runs finished, steps committed, LLM latencies."""
    from django.db.models import Count, Max

    from agentrun.models import Run, Step

    statuses = dict(Run.objects.values_list("status").annotate(c=Count("pk")).order_by())
    last_run = Run.objects.aggregate(t=Max("finished_at"))["t"]
    steps = Step.objects.filter(status="succeeded")
    last_step = steps.aggregate(t=Max("finished_at"))["t"]
    committed = steps.count()
    done_s = last_run.timestamp() - t0 if last_run else None
    span = last_step.timestamp() - t0 if last_step else None
    latencies = list(
        Step.objects.exclude(llm_latency_ms=None).values_list("llm_latency_ms", flat=True)
    )
    return {
        "statuses": statuses,
        # Runs missing from the table count too (something else emptied it?).
        "not_succeeded": n - statuses.get("succeeded", 0),
        "done_s": done_s,
        "steps": committed,
        "steps_per_s": committed / span if span else None,
        "retried_steps": Step.objects.filter(attempts__gt=1).count(),
        "llm_latency_ms": _quantiles(latencies),
        **step_breakdown(t0),
    }


def step_breakdown(t0: float) -> dict[str, Any]:
    """Where a run's time goes: waiting for its first step, each step beyond its LLM
    request, and the gaps between a run's steps (queue, hand-off)."""
    from agentrun.models import Step

    rows = Step.objects.filter(status="succeeded").order_by("run_id", "number")
    first, overhead, gaps = [], [], []
    prev: tuple[Any, Any] = (None, None)
    for run_id, number, started, finished, llm_ms in rows.values_list(
        "run_id", "number", "started_at", "finished_at", "llm_latency_ms"
    ):
        if number == 1:
            first.append(started.timestamp() - t0)
        elif prev[0] == run_id:
            gaps.append((started - prev[1]).total_seconds() * 1000)
        overhead.append((finished - started).total_seconds() * 1000 - (llm_ms or 0))
        prev = (run_id, finished)
    return {
        "first_step_start_s": _quantiles(first),
        "step_minus_llm_ms": _quantiles(overhead),
        "gap_between_steps_ms": _quantiles(gaps),
    }


def _quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    xs = sorted(xs)
    return {
        "p50": statistics.median(xs),
        "p90": xs[int(0.9 * (len(xs) - 1))],
        "p99": xs[int(0.99 * (len(xs) - 1))],
        "max": xs[-1],
        "n": len(xs),
    }


def log_figures(lines: list[str], shutdown: list[str]) -> dict[str, Any]:
    """Errors and warnings while the case ran; errors while the workers stopped, apart."""
    errors = [line for line in lines if ERROR_LINE.search(line)]
    return {
        "log_errors": len(errors),
        "log_warnings": sum(1 for line in lines if WARNING_LINE.search(line)),
        "log_error_lines": [line[:400] for line in errors[:8]],
        "shutdown_log_errors": sum(1 for line in shutdown if ERROR_LINE.search(line)),
    }


# --- report ------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def meta(args: argparse.Namespace, extra_env: dict[str, str]) -> dict[str, Any]:
    from django.conf import settings

    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "runtime_commit": _git("log", "-1", "--format=%h %<(60,trunc)%s", "--", "agentrun").strip(),
        "dirty": bool(_git("status", "--porcelain", "--", "agentrun")),
        "cores": os.cpu_count(),
        "cpu": machine().get("cpu", "?"),
        "python": platform.python_version(),
        "load_avg_start": os.getloadavg(),
        "worker_command": " ".join(["python", *WORKER_CMD[1:]]) + " -n llmbenchN@%h",
        "workers": args.workers,
        "extra_env": extra_env,
        "latency_s": args.latency,
        "rate_limited": args.rate_limited,
        "database": settings.DATABASES["default"]["NAME"],
        "broker": env.BROKER_URL,
    }


def _load(avg: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def _fmt(x: Any, spec: str = ".1f") -> str:
    return "–" if x is None else format(x, spec)


def table(cases: list[dict[str, Any]], ideal_s: float, floor: float | None) -> list[str]:
    rows = [
        "| case | runs | done in (s) | ×ideal | steps/s | % of CPU floor | LLM requests "
        "(429s) | peak LLM in flight | LLM latency p50/p99 (ms) | peak PG conns (busy) | "
        "peak worker RSS (MB) | worker CPU s (ms/step) | log errors / warnings | not succeeded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        if "error" in c:
            rows.append(f"| {c['case']} | {c['runs']} | **failed**: {c['error'][:200]} |")
            continue
        llm = c["agent"] == "llm"
        srv, lat = c.get("llm_server", {}), c.get("llm_latency_ms", {})
        share = c["steps_per_s"] / floor if llm and floor and c["steps_per_s"] else None
        done = _fmt(c["done_s"], ".2f") + (" (timed out)" if c["active_left"] else "")
        rows.append(
            f"| {c['case']} | {c['runs']:,} | {done} | "
            f"{_fmt(c['done_s'] / ideal_s if llm and c['done_s'] else None, '.1f')} | "
            f"{_fmt(c['steps_per_s'])} | {_fmt(share * 100 if share else None, '.0f')} | "
            f"{srv.get('requests', 0):,} ({srv.get('rate_limited', 0)}) | "
            f"{srv.get('peak_in_flight', 0) if llm else '–'} | "
            f"{_fmt(lat.get('p50'), '.0f')}/{_fmt(lat.get('p99'), '.0f')} | "
            f"{c['peak_pg_connections']} ({c['peak_pg_connections_busy']}) | "
            f"{c['peak_rss_bytes'] / MB:.0f} | {c['worker_cpu_s']:.1f} ({_fmt(_cpu_ms(c), '.1f')}) | "
            f"{c['log_errors']} / {c['log_warnings']} | {c['not_succeeded']} |"
        )
    return rows


def breakdown(cases: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| case | runs created (s) | wake-ups sent (s) | first step started p50 / max (s) | "
        "step minus its LLM request p50 / p99 (ms) | gap between a run's steps p50 / p99 (ms) | "
        "retried steps | peak messages waiting in Redis | fake LLM CPU (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        if "error" in c:
            continue
        first, own, gap = c["first_step_start_s"], c["step_minus_llm_ms"], c["gap_between_steps_ms"]
        rows.append(
            f"| {c['case']} | {c['create_s']:.1f} | {c['publish_s']:.1f} | "
            f"{_fmt(first.get('p50'), '.2f')} / {_fmt(first.get('max'), '.2f')} | "
            f"{_fmt(own.get('p50'))} / {_fmt(own.get('p99'))} | "
            f"{_fmt(gap.get('p50'))} / {_fmt(gap.get('p99'))} | {c['retried_steps']} | "
            f"{c['peak_queued_in_redis']:,} | {c['llm_server_cpu_s']:.1f} |"
        )
    return rows


def _cpu_ms(c: dict[str, Any]) -> float | None:
    """Worker CPU per committed step: what the machine's load changes least."""
    return c["worker_cpu_s"] * 1000 / c["steps"] if c.get("steps") else None


def verdicts(cases: list[dict[str, Any]], floor: float | None) -> list[str]:
    rows = ["| target | measured | verdict |", "|---|---|---|"]

    def add(target: str, measured: str, ok: bool) -> None:
        rows.append(f"| {target} | {measured} | {'met' if ok else '**missed**'} |")

    floor_case = next((c for c in cases if c["case"] == "floor" and "error" not in c), None)
    floor_cpu = _cpu_ms(floor_case) if floor_case else None
    for c in cases:
        if c["agent"] != "llm" or "error" in c:
            continue
        n = c["runs"]
        clean = c["log_errors"] == 0 and c["not_succeeded"] == 0
        add(
            f"{n:,} runs: no errors in the worker logs, all succeeded",
            f"{c['log_errors']} errors, {c['not_succeeded']} not succeeded",
            clean,
        )
        if n == 1000:
            done = c["done_s"] if not c["active_left"] else None
            add(
                "1,000 runs done",
                f"{_fmt(done, '.2f')} s (≤ 8 s)",
                done is not None and done <= TARGET_1000_SECONDS,
            )
            add(
                "1,000 runs: PostgreSQL connections held by workers",
                f"{c['peak_pg_connections']} (≤ 20)",
                c["peak_pg_connections"] <= TARGET_PG_CONNECTIONS,
            )
            add(
                "1,000 runs: worker RSS",
                f"{c['peak_rss_bytes'] / MB:.0f} MB (≤ 1,024)",
                c["peak_rss_bytes"] <= TARGET_RSS_BYTES,
            )
        if n == 10000 and floor:
            share = (c["steps_per_s"] or 0) / floor
            cpu = _cpu_ms(c)
            bound = (
                f"; worker CPU per step {cpu:.1f} ms vs the floor's {floor_cpu:.1f} ms: "
                f"{floor_cpu / cpu:.0%} at most, with the CPU to themselves"
                if cpu and floor_cpu
                else ""
            )
            add(
                "10,000 runs: steps/s vs the CPU-bound floor",
                f"{share:.0%} (≥ 50%){bound}",
                share >= TARGET_FLOOR_SHARE and not c["active_left"],
            )
    return rows


def report(results: dict[str, Any]) -> str:
    m, cases = results["meta"], results["cases"]
    floor = results.get("floor_steps_per_s")
    ideal = results["ideal_s"]
    extra = " ".join(f"{k}={v}" for k, v in m["extra_env"].items()) or "none"
    lines = [
        f"## LLM-bound runs (bench/llm_bench.py, {m['started_at']})",
        "",
        f"- Code: {m['commit']} (runtime: {m['runtime_commit']}{', dirty' if m['dirty'] else ''}); "
        f"{m['cores']} cores ({m.get('cpu', '?')}), load average at start {_load(m['load_avg_start'])}, at end "
        f"{_load(m['load_avg_end'])} (a shared machine: other processes take CPU too).",
        f"- Workers: {m['workers']} × `{m['worker_command']}`; extra environment: {extra}.",
        f"- Fake LLM: {m['latency_s']:g} s per request, 3 requests per `llm` run (echo, echo, "
        f"answer): ideal {ideal:g} s per run; 429 fraction {m['rate_limited']:g}.",
        f"- CPU-bound floor: {results['floor_desc']}: **{_fmt(floor)} steps/s**.",
        "",
        *table(cases, ideal, floor),
        "",
        "done in: from the first wake-up sent to the last run finished (`Run.finished_at`); "
        "steps/s: steps committed / (last commit − first wake-up); LLM latency: as the workers "
        "measured each request (server latency + waiting in the client); PG conns: peak of "
        f"pg_stat_activity rows with application_name = '{APP_NAME}' (busy: not idle), "
        "polled every 100 ms; RSS: sum of VmRSS over the workers' process groups, every 300 ms.",
        "",
        *breakdown(cases),
        "",
        *verdicts(cases, floor),
    ]
    for c in cases:
        if c.get("log_error_lines"):
            lines += ["", f"First error lines of the worker logs, {c['case']}:", "", "```"]
            lines += c["log_error_lines"] + ["```"]
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, nargs="*", default=[100], help="LLM runs per case")
    p.add_argument("--latency", type=float, default=1.0, help="fake LLM seconds per request")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="extra worker environment, e.g. AGENTRUN_WORKER_POOL=prefork (repeatable)",
    )
    p.add_argument("--floor-runs", type=int, default=200, help="scripted runs of the floor")
    p.add_argument("--floor-steps", type=int, default=10, help="echo steps per floor run")
    p.add_argument("--no-floor", action="store_true", help="skip the CPU-bound floor case")
    p.add_argument("--rate-limited", type=float, default=0.0, help="fraction answered 429")
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of a 429, s")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--out", default="bench/llm_results.json", help="JSON results")
    p.add_argument("--report-only", metavar="JSON", help="only print the report of saved results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        print(report(json.loads(Path(args.report_only).read_text())), end="")
        return 0
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    env.setup()
    results: dict[str, Any] = {
        "meta": meta(args, extra_env),
        "ideal_s": 3 * args.latency,
        "floor_desc": f"{args.floor_runs} `scripted` runs × {args.floor_steps} echo steps + answer",
        "cases": [],
    }
    server = FakeLLMServer(args.latency, args.rate_limited, args.retry_after)
    environment = worker_environment(server.base_url, extra_env)
    plan: list[tuple[str, str, Callable[[], Any], int]] = []
    if not args.no_floor:
        plan.append(
            ("floor", "scripted", lambda: scripted_input(args.floor_steps), args.floor_runs)
        )
    plan += [(f"llm-{n}", "llm", llm_input, n) for n in args.runs]
    try:
        for name, agent, make_input, n in plan:
            print(f"{name}: {n} {agent} runs ...", file=sys.stderr, flush=True)
            try:
                case = run_case(name, agent, make_input, n, args, server, environment)
            except Exception as exc:  # noqa: BLE001 -- reported, and the next case runs
                case = {
                    "case": name,
                    "agent": agent,
                    "runs": n,
                    "error": f"{type(exc).__name__}: {exc}",
                }
                reset_state()
            results["cases"].append(case)
            if name == "floor" and "error" not in case:
                results["floor_steps_per_s"] = case["steps_per_s"]
            print(f"  {_brief(case)}", file=sys.stderr, flush=True)
    finally:
        server.stop()
    results["meta"]["load_avg_end"] = os.getloadavg()
    text = report(results)
    results["markdown"] = text
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(text)
    return 0


def _brief(c: dict[str, Any]) -> str:
    if "error" in c:
        return c["error"]
    return (
        f"done in {_fmt(c['done_s'], '.2f')} s, {_fmt(c['steps_per_s'])} steps/s, "
        f"peak LLM in flight {c.get('llm_server', {}).get('peak_in_flight')}, "
        f"PG {c['peak_pg_connections']}, RSS {c['peak_rss_bytes'] / MB:.0f} MB, "
        f"{c['log_errors']} log errors, {c['not_succeeded']} not succeeded"
    )


if __name__ == "__main__":
    sys.exit(main())
