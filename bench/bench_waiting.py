"""What a step waiting on the model costs a worker process: memory per waiting step.

    .venv/bin/python bench/bench_waiting.py --waiting 500 1000 2000 4000 --latency 20

For each count N: one default worker process with `AGENTRUN_WORKER_CONCURRENCY=N` (and the
LLM cap as high), N `llm` runs against bench/fake_llm.py answering after `--latency` s; once
the fake LLM has N requests in flight (every run's first step waiting on the model), the
worker's RSS and threads are read, and its PostgreSQL connections (pg_stat_activity). The
slope of RSS over N is the memory of one waiting step: what sizes the threads pool.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
    APP_NAME,
    FakeLLMServer,
    Workers,
    group_pids,
    llm_input,
    publish,
    reset_state,
    rss_bytes,
    worker_environment,
)
from bench.report import machine  # noqa: E402

MB = 1024 * 1024


def connections() -> int:
    with env.raw(autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
        ).fetchone()[0]


def threads(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/task"))
    return total


def case(n: int, args: argparse.Namespace, server: FakeLLMServer) -> dict[str, Any]:
    from agentrun.lifecycle import services

    reset_state()
    ids = [str(services.start_run("llm", llm_input()).pk) for _ in range(n)]
    environment = worker_environment(
        server.base_url,
        {"AGENTRUN_WORKER_CONCURRENCY": str(n), "AGENTRUN_LLM_MAX_CONCURRENCY": str(n)},
    )
    deadline = time.monotonic() + args.timeout
    workers = Workers(1, environment, f"waiting-{n}", deadline)
    try:
        pids = group_pids(workers.pgids)
        idle_rss = rss_bytes(pids)
        server.stats(reset=True)
        publish(ids)
        in_flight, peak = 0, {}
        while time.monotonic() < deadline:
            in_flight = server.stats()["in_flight"]
            if in_flight >= n:
                time.sleep(1.0)  # every step waiting: what they hold now
                peak = {
                    "rss_bytes": rss_bytes(group_pids(workers.pgids)),
                    "threads": threads(group_pids(workers.pgids)),
                    "pg_connections": connections(),
                    "in_flight": server.stats()["in_flight"],
                }
                break
            time.sleep(0.2)
    finally:
        workers.stop()
    reset_state()
    return {"waiting": n, "idle_rss_bytes": idle_rss, **peak, "reached": in_flight}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--waiting", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    p.add_argument("--latency", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=240.0)
    p.add_argument("--out", default="bench/out/waiting_results.json")
    args = p.parse_args(argv)
    env.setup()
    server = FakeLLMServer(args.latency, 0.0, 1.0)
    results: list[dict[str, Any]] = []
    try:
        for n in args.waiting:
            results.append(case(n, args, server))
            print(results[-1], file=sys.stderr, flush=True)
    finally:
        server.stop()
    lines = [
        "| steps waiting on the model | worker RSS | threads | PostgreSQL connections |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['waiting']} | {r.get('rss_bytes', 0) / MB:.0f} MB (idle {r['idle_rss_bytes'] / MB:.0f}) "
            f"| {r.get('threads', '–')} | {r.get('pg_connections', '–')} |"
        )
    ok = [r for r in results if r.get("rss_bytes")]
    if len(ok) >= 2:
        a, b = ok[0], ok[-1]
        slope = (b["rss_bytes"] - a["rss_bytes"]) / (b["waiting"] - a["waiting"])
        lines.append(f"\nMemory per waiting step (RSS slope): {slope / 1024:.0f} KB.")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"machine": machine(), "results": results, "markdown": text}, indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
