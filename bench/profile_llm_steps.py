"""Profile the CPU cost of `llm` steps in this process, against bench/fake_llm.py.

    .venv/bin/python bench/profile_llm_steps.py --runs 200 [--profile out.prof] [--top 40]

Creates `--runs` llm runs (the input of bench/llm_bench.py), then executes each run
as a worker's task does (execute_step with the settings' chain, so its three steps
run in one call), one run after the other, against the fake LLM at zero latency.
Prints the CPU time of this process per step (the fake runs in its own process) and
per run start; with --profile, cProfile's stats of the steps.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3, help="batches of --runs; the median is shown")
    p.add_argument("--profile", help="write cProfile stats of the steps here")
    p.add_argument("--top", type=int, default=0, help="print the top functions by own time")
    p.add_argument("--sql", action="store_true", help="list the SQL statements per step")
    args = p.parse_args()

    from bench import env
    from bench.llm_bench import FakeLLMServer, llm_input

    server = FakeLLMServer(latency=0.0, rate_limited=0.0, retry_after=1.0)
    try:
        os.environ.update(AGENTRUN_LLM_BASE_URL=server.base_url, AGENTRUN_LLM_API_KEY="bench-key")
        env.setup()
        from django.conf import settings

        from agentrun.builtin import llm
        from agentrun.lifecycle import services

        llm.prepare()
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        per_step, per_start = [], []
        statements: collections.Counter[str] = collections.Counter()

        def count(execute, sql, params, many, context):  # noqa: ANN001
            statements[" ".join(sql.split()[:6])[:90]] += 1
            return execute(sql, params, many, context)

        from django.db import connection

        for _ in range(args.repeat):
            # a context manager made by a generator is entered once: a new one per batch
            watching = connection.execute_wrapper(count) if args.sql else contextlib.nullcontext()
            env.truncate()
            c0 = time.process_time()
            ids = [str(services.start_run("llm", llm_input()).pk) for _ in range(args.runs)]
            per_start.append((time.process_time() - c0) / args.runs * 1000)
            steps = 0
            c0 = time.process_time()
            if profiler:
                profiler.enable()
            with watching:
                total = _execute(ids, settings.AGENTRUN_CHAIN_SECONDS)
            if profiler:
                profiler.disable()
            steps += total
            per_step.append((time.process_time() - c0) / steps * 1000)
        if args.sql:
            for sql, n in statements.most_common():
                print(f"{n / steps / args.repeat:6.2f} per step  {sql}")
        print(
            f"CPU per step {statistics.median(per_step):.2f} ms "
            f"({', '.join(f'{x:.2f}' for x in per_step)}); "
            f"per run created {statistics.median(per_start):.2f} ms"
            + (" (under cProfile)" if profiler else "")
        )
        if profiler:
            profiler.dump_stats(args.profile)
            if args.top:
                pstats.Stats(args.profile).sort_stats("tottime").print_stats(args.top)
    finally:
        server.stop()
    return 0


def _execute(ids: list[str], chain: float) -> int:
    """Each run's steps, as the worker's tasks would; returns the steps executed."""
    from agentrun import engine

    steps = 0
    for pk in ids:
        n = 1
        while True:  # a chain ends early only when its time is up
            out = engine.execute_step(pk, n, chain=chain)
            steps += out.step - n + 1
            if out.status in ("finished", "failed", "not_claimed"):
                break
            n = out.step + 1
    return steps


if __name__ == "__main__":
    raise SystemExit(main())
