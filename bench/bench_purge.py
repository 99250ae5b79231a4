"""Retention at scale: purge throughput, and what a purge does to live runs' steps.

Run by hand, not by pytest, on a PostgreSQL database of its own (it empties it):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_purge_bench \\
        .venv/bin/python bench/bench_purge.py [--steps 1000000] [--per-run 50] [--live 4]

1. Drives one template run (`--per-run` steps, each an `echo` read call) through the
   engine, then copies it with bulk SQL (generate_series, INSERT ... SELECT) into
   `--steps / --per-run` old finished runs: steps, pre/post snapshots, read calls.
2. Baseline: `--live` threads in another process step scripted runs through the engine
   (claim, decide, read call, commit: a whole step as a worker does it) for a while;
   every step's latency is recorded.
3. The same stepping again while `retention.purge` deletes every old run.

Prints the purge's throughput (steps/s, and rows/s over steps, snapshots and calls) and
the live steps' p50/p99 with and without the purge, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/agentrun-purge-bench")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ.setdefault("LOG_LEVEL", "WARNING")


def _setup() -> None:
    import django

    django.setup()


def scripted(steps: int, goal: str) -> dict[str, Any]:
    body = [
        {"thought": f"look {i}", "calls": [{"tool": "echo", "args": {"n": i}}]}
        for i in range(steps)
    ]
    return {"goal": goal, "steps": [*body, {"thought": "finish", "final": "done"}]}


# --- the old data -------------------------------------------------------------------------


def _columns(model: Any, replace: dict[str, str]) -> tuple[str, str]:
    """The model's columns (not its id) and the SELECT list copying them, with replacements."""
    cols = [f.column for f in model._meta.concrete_fields if not f.primary_key]
    return ", ".join(cols), ", ".join(replace.get(c, f"t.{c}") for c in cols)


def build_old_runs(total_steps: int, per_run: int) -> tuple[int, Any]:
    """`total_steps // per_run` finished runs, 40 days old, copied from a template run."""
    from django.db import connection

    from agentrun.models import Run, Snapshot, Step, ToolCall
    from tests.base import drive, make_run

    template = drive(make_run(scripted(per_run - 1, "template")), max_steps=per_run + 5)
    assert template.status == "succeeded", template.status
    count = total_steps // per_run
    started = time.monotonic()
    with connection.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE copies AS SELECT gen_random_uuid() AS id FROM generate_series(1, %s)",
            [count],
        )
        run_cols, run_sel = _columns(
            Run,
            {
                "finished_at": "now() - interval '40 days'",
                "created_at": "now() - interval '40 days'",
                "started_at": "now() - interval '40 days'",
            },
        )
        cur.execute(
            f"INSERT INTO agentrun_run (id, {run_cols}) SELECT c.id, {run_sel} "
            "FROM agentrun_run t CROSS JOIN copies c WHERE t.id = %s",
            [template.pk],
        )
        step_cols, step_sel = _columns(Step, {"run_id": "c.id"})
        cur.execute(
            f"INSERT INTO agentrun_step ({step_cols}) SELECT {step_sel} "
            "FROM agentrun_step t CROSS JOIN copies c WHERE t.run_id = %s",
            [template.pk],
        )
        snap_cols, snap_sel = _columns(Snapshot, {"run_id": "c.id"})
        cur.execute(
            f"INSERT INTO agentrun_snapshot ({snap_cols}) SELECT {snap_sel} "
            "FROM agentrun_snapshot t CROSS JOIN copies c WHERE t.run_id = %s",
            [template.pk],
        )
        call_cols, call_sel = _columns(
            ToolCall,
            {
                "run_id": "c.id",
                "step_id": "ns.id",
                "idempotency_key": "c.id::text || substr(t.idempotency_key, 37)",
            },
        )
        cur.execute(
            f"INSERT INTO agentrun_toolcall ({call_cols}) SELECT {call_sel} "
            "FROM agentrun_toolcall t JOIN agentrun_step ts ON ts.id = t.step_id "
            "CROSS JOIN copies c JOIN agentrun_step ns ON ns.run_id = c.id AND ns.number = ts.number "
            "WHERE t.run_id = %s",
            [template.pk],
        )
        cur.execute("DROP TABLE copies")
        cur.execute("ANALYZE")
    return count, time.monotonic() - started


def table_sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class "
            "WHERE relname IN ('agentrun_step', 'agentrun_snapshot', 'agentrun_toolcall', 'agentrun_run')"
        )
        return dict(cur.fetchall())


# --- live runs stepping in another process -------------------------------------------------


def stepper(seconds: float, threads: int, out: str, until: str) -> None:
    """Step scripted runs through the engine in `threads` threads until `seconds` pass or the
    file `until` exists; write every step's latency (seconds) to `out`."""
    _setup()
    from django.db import connection

    from agentrun import engine
    from tests.base import make_run

    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def work(i: int) -> None:
        mine: list[float] = []
        try:
            while time.monotonic() < deadline and not os.path.exists(until):
                run = make_run(scripted(200, f"live {i}"))
                n = run.next_step
                while time.monotonic() < deadline and not os.path.exists(until):
                    t0 = time.perf_counter()
                    outcome = engine.execute_step(run.pk, n)
                    mine.append(time.perf_counter() - t0)
                    if outcome.status != "committed":
                        break  # finished (or anything else): start another run
                    n += 1
        finally:
            connection.close()
            with lock:
                latencies.extend(mine)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    Path(out).write_text(json.dumps(latencies))


def start_stepper(
    seconds: float, threads: int, tmp: Path, name: str
) -> tuple[subprocess.Popen, Path, Path]:
    out, until = tmp / f"{name}.json", tmp / f"{name}.stop"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--stepper", str(seconds), str(threads), str(out), str(until)],
        env=os.environ.copy(),
    )
    return proc, out, until


class LockWatch(threading.Thread):
    """Samples, every 100 ms, how many of the database's sessions wait on a lock (its own
    connection: psycopg, not Django's)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples = 0
        self.waiting = 0
        self.stop = threading.Event()

    def run(self) -> None:
        import psycopg
        from django.db import connection

        db = connection.settings_dict
        with psycopg.connect(
            host=db["HOST"] or "127.0.0.1",
            port=db["PORT"] or 5432,
            user=db["USER"],
            password=db["PASSWORD"] or None,
            dbname=db["NAME"],
            autocommit=True,
        ) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                ).fetchone()
                self.samples += 1
                self.waiting += bool(n)
                time.sleep(0.1)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000


def summary(values: list[float]) -> str:
    return (
        f"{len(values)} steps, p50 {statistics.median(values) * 1000:.1f} ms, "
        f"p99 {pct(values, 0.99):.1f} ms, max {max(values) * 1000:.1f} ms"
    )


def _create_database() -> None:
    """The database DATABASE_URL names, created if it is missing."""
    from urllib.parse import urlparse

    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    assert url.startswith("postgres"), "give it a PostgreSQL DATABASE_URL of its own"
    name = urlparse(url).path.lstrip("/")
    admin = urlparse(url)._replace(path="/postgres", query="").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--per-run", type=int, default=50)
    parser.add_argument("--live", type=int, default=4, help="threads stepping live runs")
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds of stepping alone")
    args = parser.parse_args()
    _create_database()
    _setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    from agentrun.lifecycle import retention
    from agentrun.models import Run

    assert connection.vendor == "postgresql", "give it a PostgreSQL DATABASE_URL of its own"
    call_command("migrate", verbosity=0)
    with connection.cursor() as cur:
        # Empty it, past the event log's TRUNCATE trigger (the bench's database only).
        cur.execute("SET session_replication_role = replica")
        cur.execute(
            "TRUNCATE agentrun_event, agentrun_toolcall, agentrun_snapshot, agentrun_step, "
            "agentrun_ledgerentry, agentrun_ledgerinvocation, agentrun_outboxmessage, "
            "agentrun_reservation, agentrun_run CASCADE"  # and whatever else refers to runs
        )
        cur.execute("SET session_replication_role = DEFAULT")
    runs, build_s = build_old_runs(args.steps, args.per_run)
    steps = runs * args.per_run
    sizes = table_sizes()
    print(
        f"old data: {runs:,} runs x {args.per_run} steps = {steps:,} steps "
        f"({steps * 2:,} snapshots, {runs * (args.per_run - 1):,} read calls) built in {build_s:.0f} s; "
        f"tables {sum(sizes.values()) / 2**20:.0f} MB ({sizes})",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proc, out, _ = start_stepper(args.baseline, args.live, tmp, "baseline")
        proc.wait()
        baseline = json.loads(out.read_text())
        print(f"live steps alone ({args.live} threads): {summary(baseline)}", flush=True)

        proc, out, until = start_stepper(3600, args.live, tmp, "during")
        time.sleep(3)  # the stepper's threads are going
        locks = LockWatch()
        locks.start()
        t0 = time.monotonic()
        report = retention.purge(timedelta(days=30), batch=settings.AGENTRUN_PURGE_BATCH)
        purge_s = time.monotonic() - t0
        locks.stop.set()
        locks.join()
        until.touch()
        proc.wait()
        during = json.loads(out.read_text())
    rows = report.steps + report.snapshots + report.tool_calls
    assert report.runs == runs and report.steps == steps, report.as_dict()
    assert not Run.objects.filter(purged_at__isnull=True, finished_at__lt=report.cutoff).exists()
    print(
        f"purge: {report.runs:,} runs, {report.steps:,} steps, {report.snapshots:,} snapshots, "
        f"{report.tool_calls:,} read calls in {purge_s:.1f} s: {report.steps / purge_s:,.0f} steps/s, "
        f"{rows / purge_s:,.0f} rows/s (batch {settings.AGENTRUN_PURGE_BATCH})",
        flush=True,
    )
    print(f"live steps during the purge: {summary(during)}")
    print(
        f"sessions waiting on a lock: in {locks.waiting} of {locks.samples} samples "
        "(every 100 ms during the purge)"
    )
    ratio = pct(during, 0.99) / pct(baseline, 0.99)
    ratio50 = statistics.median(during) / statistics.median(baseline)
    print(f"p99 during / alone: {ratio:.2f}x (p50 {ratio50:.2f}x)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--stepper":
        stepper(float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main()
