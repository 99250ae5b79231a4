"""Reads of one snapshot at several places of a 1,000-step run, for comparing two commits.

    .venv/bin/python bench/bench_reads.py --variant flat [--n 1000] [--repeats 40]

Plays one workload run through the engine in-process on the bench database (tables
truncated first, as bench/run.py does), then times, each as the median and the
minimum of `--repeats` calls in this process:
- `snapshots.load(run, step, "post")` at a few steps after N/2 and at N (a row read
  and its chain replayed), the first call of each after the process's dictionaries
  and keyframes were forgotten ("cold") and the others ("warm");
- the pre→post diff of step N as the diff pages compute it (`diff_snapshots`);
- the whole history (`snapshots.history`).
The file runs unchanged at older commits (it only calls what they have), so the same
command in a checkout of each gives the two sides of a comparison on one machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _timed(fn: Any, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), min(times)


def _forget() -> None:
    from agentrun.store import codec, snapshots

    codec.forget_dictionaries()
    if hasattr(snapshots, "forget_keyframe_texts"):
        snapshots.forget_keyframe_texts()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--variant", default="flat")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=40)
    args = p.parse_args()

    from bench import env

    env.setup()
    from django.conf import settings

    from agentrun.lifecycle import services
    from agentrun.models import Snapshot
    from agentrun.store import snapshots
    from bench.measure import engine_steps, inputs
    from debugger.states import diff_snapshots

    settings.AGENTRUN_ENQUEUE = False
    env.truncate()
    n = args.n
    run = services.start_run("workload", inputs(args.variant, n))
    engine_steps(run.pk, 1, n + 1, time.monotonic() + 3600)
    keyframes = Snapshot.objects.filter(run=run, kind="full").count()
    print(f"{args.variant} N={n}: {keyframes} keyframes")
    cells = []
    for step in (n // 2, n // 2 + 10, n // 2 + 30, n):
        snap = snapshots.get(run.pk, step, "post")
        _forget()
        t0 = time.perf_counter()
        snapshots.load(run.pk, step, "post")
        cold = (time.perf_counter() - t0) * 1000
        med, low = _timed(lambda s=step: snapshots.load(run.pk, s, "post"), args.repeats)
        rows = snap.seq - snap.keyframe_seq + 1
        cells.append(f"step {step} ({rows} rows): cold {cold:.2f}, warm {med:.2f} (min {low:.2f})")
    med, low = _timed(
        lambda: diff_snapshots(snapshots.get(run.pk, n, "pre"), snapshots.get(run.pk, n, "post")),
        args.repeats,
    )
    cells.append(f"diff of step {n}: {med:.2f} (min {low:.2f})")
    med, low = _timed(lambda: snapshots.history(run.pk), max(3, args.repeats // 8))
    cells.append(f"history: {med:.1f} (min {low:.1f})")
    for cell in cells:
        print("  " + cell + " ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
