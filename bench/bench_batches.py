"""Replay batches at incident size: preview, creation, and forks beside other runs.

    .venv/bin/python bench/bench_batches.py --runs 1000 --others 200 --latency 1.0

An incident: `--runs` runs of the `llm` agent failed at their first step (made directly in
the database: how they failed is not what is measured). Then, on PostgreSQL
(`BENCH_DATABASE_URL`, default the database agentrun_batch_bench) and Redis
(`BENCH_BROKER_URL`, default db 5):

- preview: `batches.plan` over the incident's filter (5 times; the median), beside the floor
  of reading the selected runs' rows alone;
- creation: `batches.create` (the batch and an item per run, one transaction);
- the batch runs on `--workers` default worker processes against bench/fake_llm.py
  (`--latency` s a request, 3 requests a run), `--max-in-flight` forks at once, while
  `--others` ordinary `llm` runs start with it; the same runs alone are the baseline:
  the ratio of their median durations (with the batch / alone) is how much the batch
  delays the other runs' steps. The batch's own pace is compared with its ideal,
  waves of max-in-flight forks of 3 × latency each.

It prints a markdown table and writes the figures as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentrun_batch_bench"
)
os.environ.setdefault("BENCH_BROKER_URL", "redis://127.0.0.1:6379/5")

from bench import env  # noqa: E402
from bench.llm_bench import (  # noqa: E402
    FakeLLMServer,
    Workers,
    create_runs,
    llm_input,
    publish,
    worker_environment,
)
from bench.report import machine  # noqa: E402

FILTER = {"agent": "llm", "status": "failed", "label": "incident=bench"}


def reset() -> None:
    import redis

    env.truncate()
    with env.raw() as conn:
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("TRUNCATE agentrun_batchitem, agentrun_replaybatch, agentrun_worker CASCADE")
        conn.commit()
    redis.Redis.from_url(env.BROKER_URL).flushdb()


def make_incident(n: int, deadline: float) -> list[str]:
    """n `llm` runs labelled incident=bench, failed at step 1 (its pre snapshot written)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from agentrun.lifecycle import labels
    from agentrun.models import Run, RunLabel, Step

    ids = create_runs("llm", llm_input, n, deadline)
    now = timezone.now()
    with transaction.atomic():
        Run.objects.filter(pk__in=ids).update(
            status="failed", error="the model said no", finished_at=now, started_at=now,
            next_step=1, code_version="v1",
        )  # fmt: skip
        Step.objects.bulk_create(
            [
                Step(run_id=pk, number=1, status="failed", attempts=1, started_at=now,
                     finished_at=now, failure={"message": "the model said no"})
                for pk in ids
            ]
        )  # fmt: skip
        RunLabel.objects.bulk_create(
            [RunLabel(run_id=pk, key="incident", value="bench") for pk in ids]
        )
    assert labels.of(Run.objects.get(pk=ids[0])) == {"incident": "bench"}
    connection.close()
    return ids


def median_time(fn: Any, repeat: int = 5) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def floor_read() -> int:
    from agentrun.lifecycle import selection
    from agentrun.models import Run

    return len(list(selection.parse(FILTER).apply(Run.objects.all())))


def durations(ids: list[str], t0: float) -> list[float]:
    """Seconds from t0 (when the runs' wake-ups went out) to each succeeded run's end."""
    from agentrun.models import Run

    rows = Run.objects.filter(pk__in=ids, status="succeeded").values_list("finished_at", flat=True)
    return [f.timestamp() - t0 for f in rows]


def create(n: int) -> list[str]:
    """n `llm` runs, no wake-up sent (this process has AGENTRUN_ENQUEUE off)."""
    from agentrun.lifecycle import services

    return [str(services.start_run("llm", llm_input()).pk) for _ in range(n)]


def wait(check: Any, deadline: float, poll: float = 0.25) -> bool:
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll)
    return False


def others_alone(args: argparse.Namespace, environment: dict[str, str]) -> dict[str, Any]:
    """The ordinary runs with nothing else going on: the baseline."""
    from agentrun.models import ACTIVE_STATUSES, Run

    reset()
    deadline = time.monotonic() + args.timeout
    ids = create(args.others)
    workers = Workers(args.workers, environment, "batch-baseline", deadline)
    try:
        t0, _ = publish(ids)
        wait(lambda: not Run.objects.filter(status__in=ACTIVE_STATUSES).exists(), deadline)
    finally:
        workers.stop()
    d = durations(ids, t0)
    return {
        "others": len(ids),
        "succeeded": len(d),
        "median_s": statistics.median(d) if d else None,
    }


def with_batch(args: argparse.Namespace, environment: dict[str, str]) -> dict[str, Any]:
    from celery import current_app

    from agentrun.lifecycle import batches
    from agentrun.models import ACTIVE_STATUSES, ReplayBatch, Run

    reset()
    deadline = time.monotonic() + args.timeout
    make_incident(args.runs, deadline)
    out: dict[str, Any] = {"runs": args.runs}
    out["floor_read_s"], found = median_time(floor_read)
    assert found == args.runs, found
    out["preview_s"], plan = median_time(lambda: batches.plan(FILTER, "before-failure"))
    assert plan.count == args.runs, (plan.count, plan.skipped)
    t = time.perf_counter()
    batch = batches.create(FILTER, name="bench", max_in_flight=args.max_in_flight)
    out["create_s"] = time.perf_counter() - t
    others = create(args.others)
    workers = Workers(args.workers, environment, "batch", deadline)
    try:
        t0 = time.time()
        current_app.send_task("agentrun.batch_advance", (str(batch.pk),))
        publish(others)
        done = wait(
            lambda: (
                ReplayBatch.objects.get(pk=batch.pk).status == "done"
                and not Run.objects.filter(status__in=ACTIVE_STATUSES).exists()
            ),
            deadline,
        )
        out["batch_done_s"] = time.time() - t0 if done else None
    finally:
        workers.stop()
    forks = list(Run.objects.filter(batch=batch).values_list("pk", flat=True))
    out["forks"] = len(forks)
    out["forks_succeeded"] = len(durations([str(f) for f in forks], t0))
    out["verdicts"] = batches.counts(ReplayBatch.objects.get(pk=batch.pk))["verdicts"]
    d = durations(others, t0)
    out["others_succeeded"] = len(d)
    out["others_median_s"] = statistics.median(d) if d else None
    waves = math.ceil(args.runs / args.max_in_flight)
    out["batch_ideal_s"] = waves * 3 * args.latency
    return out


def report(r: dict[str, Any]) -> str:
    b, base = r["batch"], r["baseline"]
    ratio = (
        b["others_median_s"] / base["median_s"]
        if b.get("others_median_s") and base.get("median_s")
        else None
    )
    pace = b["batch_done_s"] / b["batch_ideal_s"] if b.get("batch_done_s") else None
    lines = [
        f"## Replay batches (bench/bench_batches.py, {r['meta']['at']})",
        "",
        f"{r['meta']['machine'].get('cpu', '?')} ({r['meta']['machine'].get('nproc')} cores),"
        f" commit {r['meta']['machine'].get('commit')}; {b['runs']} failed `llm` runs, {r['meta']['workers']} worker "
        f"process(es), fake LLM at {r['meta']['latency']} s, max in flight "
        f"{r['meta']['max_in_flight']}, {base['others']} other runs beside the batch.",
        "",
        "| figure | measured | target |",
        "|---|---|---|",
        f"| preview of {b['runs']} runs (median of 5) | {b['preview_s']:.3f} s "
        f"({b['preview_s'] / b['floor_read_s']:.1f}× reading their rows alone, "
        f"{b['floor_read_s']:.3f} s) | ≤ 1 s |",
        f"| creation (batch + {b['runs']} items) | {b['create_s']:.3f} s | ≤ 5 s |",
        f"| the batch's forks done | {b['batch_done_s']:.1f} s, {pace:.2f}× its ideal "
        f"({b['batch_ideal_s']:.0f} s: waves of max-in-flight × 3 × latency); "
        f"{b['forks_succeeded']}/{b['forks']} succeeded | – |"
        if pace
        else "| the batch's forks done | did not end | – |",
        f"| other runs' median duration, with the batch / alone | "
        f"{b['others_median_s']:.2f} s / {base['median_s']:.2f} s = {ratio:.2f}× | ≤ 2× |"
        if ratio
        else "| other runs | not measured | ≤ 2× |",
        "",
        f"Verdicts: {', '.join(f'{k} {v}' for k, v in b['verdicts'].items() if v)}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--others", type=int, default=200)
    p.add_argument("--latency", type=float, default=1.0)
    p.add_argument("--max-in-flight", type=int, default=100)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default="bench/out/batch_results.json")
    args = p.parse_args(argv)
    env.setup()
    from datetime import UTC, datetime

    results: dict[str, Any] = {
        "meta": {
            "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
            "machine": machine(),
            "workers": args.workers,
            "latency": args.latency,
            "max_in_flight": args.max_in_flight,
        }
    }
    server = FakeLLMServer(args.latency, 0.0, 1.0)
    try:
        environment = worker_environment(server.base_url, {})
        results["baseline"] = others_alone(args, environment)
        print(f"baseline: {results['baseline']}", file=sys.stderr)
        results["batch"] = with_batch(args, environment)
        print(f"batch: {results['batch']}", file=sys.stderr)
    finally:
        server.stop()
    text = report(results)
    results["markdown"] = text
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
