"""The path history and the StateAgent step at scale, measured through the real engine on PostgreSQL. Run by hand:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<a database of its own> \\
        .venv/bin/python bench/bench_watch.py [--steps 10000] [--repeat 5] [--no-state-agent]
        [--state-agent-only] [--state-runs K] [--interleaved K] [--worker-gc] [--regrouped]

1. A StateAgent step's cost at step 100 and at step 10,000: the `workload_state` agent
   (bench/state_agent.py: the workload's steps on the typed AgentState) runs N steps
   in-process (engine.execute_step with an unlimited chain: each commit claims the next
   step); a step's time runs from the previous commit to its own. Reported: the median and
   the mean over steps 51-150 and over the last 100 steps, and their ratio. With
   --interleaved K, K more measurements that don't compare two moments of a machine whose
   speed drifts: the last 100 steps of one run taken in turns with steps 51-150 of another.
2. The history of one path (agentrun.store.watch.history, what the watch page, the API and
   `manage.py watch` call): its first page, as the API and the page ask for it (they read
   the run only as far as the page), and the whole history (the command, a last page), in
   10,000-step runs of the plain-dict `workload` agent, grow and
   flat variants, and of the StateAgent run: the median of --repeat timings per path, each
   on a new database connection. The workload runs' snapshots are written as the engine
   writes them (snapshots.build: a REF pre and a delta or keyframe post per step) without
   running the steps, which would take minutes and change nothing that is read here.
   With --regrouped, every run's deltas are regrouped first (agentrun.store.compaction, as a
   worker does when a long run ends), and the histories read that.

It migrates the database and deletes the runs it made (and only those) at the start of
each case. Prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/agentrun-watch-bench")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ["AGENTRUN_FAULTS"] = "0"
os.environ["AGENTRUN_AGENT_MODULES"] = "bench.agent,bench.state_agent"
os.environ.setdefault("AGENTRUN_MAX_STEPS", "1000000")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from agentrun import engine  # noqa: E402
from agentrun.lifecycle import services  # noqa: E402
from agentrun.models import Run, Step  # noqa: E402
from agentrun.store import watch  # noqa: E402

LABEL = "bench_watch"  # in the run input: how this script finds (and deletes) its own runs


def run_steps(agent: str, variant: str, n: int) -> tuple[Run, list[float], list[float]]:
    """A run of n steps (+ the answer), driven in-process; the wall and CPU time of each step."""
    run = services.start_run(agent, {"goal": LABEL, "variant": variant, "n": n, "label": LABEL})
    times: list[float] = []
    cpu: list[float] = []
    last = [time.perf_counter(), time.process_time()]

    def observe(outcome: engine.Outcome) -> None:
        now, now_cpu = time.perf_counter(), time.process_time()
        times.append(now - last[0])
        cpu.append(now_cpu - last[1])
        last[0], last[1] = now, now_cpu

    engine.execute_step(run.pk, run.next_step, chain=24 * 3600.0, observe=observe)
    run.refresh_from_db()
    assert run.status == "succeeded", (run.status, run.error)
    return run, times, cpu


def interleaved(agent: str, variant: str, n: int, pairs: int = 100) -> dict[str, Any]:
    """Steps n-pairs+1..n of one run and steps 51..50+pairs of another, taken in turns.

    The machine's speed moves by up to 2x within minutes (other tenants), so two windows
    measured minutes apart compare the machine as much as the steps. Here each late step
    has an early step next to it in time: A's step, then B's, then B's, then A's... Every
    step is its own execute_step call (claim, decide, act, commit; no chain), in both runs.
    """

    def start() -> Run:
        return services.start_run(
            agent, {"goal": LABEL, "variant": variant, "n": n, "label": LABEL}
        )

    def one(run: Run, k: int) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        out = engine.execute_step(run.pk, k)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        assert out.status == "committed" and out.step == k, (out.status, out.step, k)
        return wall, cpu

    late, early = start(), start()
    for k in range(1, n - pairs + 1):
        one(late, k)
    for k in range(1, 51):
        one(early, k)
    got: dict[str, list[tuple[float, float]]] = {"late": [], "early": []}
    for i in range(pairs):
        turns = [("late", late, n - pairs + 1 + i), ("early", early, 51 + i)]
        for name, run, k in turns if i % 2 == 0 else reversed(turns):
            got[name].append(one(run, k))
    out: dict[str, Any] = {}
    for name, values in got.items():
        out[name] = (
            statistics.median(w for w, _ in values) * 1000,
            statistics.median(c for _, c in values) * 1000,
        )
    size = Step.objects.filter(run=late, number=n).values_list("state_size", flat=True).first()
    out["size"] = size or 0
    return out


def snapshot_chain(variant: str, n: int) -> Run:
    """A finished run whose snapshots are the workload's n steps, stored as the engine does."""
    from agentrun.models import Snapshot
    from agentrun.store import hashing, snapshots
    from bench.wl import workload

    run = Run.objects.create(
        agent="workload",
        input={"variant": variant, "n": n, "label": LABEL},
        status="succeeded",
        next_step=n + 1,
    )
    state = workload.initial_state(variant)
    first, node = snapshots.build(run.pk, 1, "pre", state, None, None)
    first.save()
    prev, batch = first, []
    for k in range(1, n + 1):
        if k > 1:
            batch.append(snapshots.reference(run.pk, k, "pre", prev))
        new = workload.apply_delta(state, workload.step_delta(k, variant), variant)
        prev, node = snapshots.build(run.pk, k, "post", new, prev, state, prev_node=node)
        batch.append(prev)
        state = new
        if len(batch) >= 500:
            Snapshot.objects.bulk_create(batch)
            batch = []
    Snapshot.objects.bulk_create(batch)
    assert hashing.build(state).hex == prev.hash
    return run


def regroup(runs: Any) -> None:
    """Regroup each run's deltas (agentrun.store.compaction); print the time and the bytes."""
    from django.db.models import BinaryField, ExpressionWrapper, F, Sum
    from django.db.models.functions import Length

    from agentrun.models import Snapshot
    from agentrun.store import compaction

    settings.AGENTRUN_COMPACT_STEPS = 1
    raw = Length(ExpressionWrapper(F("data"), output_field=BinaryField()))

    def delta_bytes(run: Run) -> int:
        rows = Snapshot.objects.filter(run=run, kind="delta")
        return rows.aggregate(b=Sum(raw))["b"] or 0

    print("\n| run | deltas regrouped | in | delta bytes before | after |")
    print("|---|---|---|---|---|")
    for run in runs:
        before = delta_bytes(run)
        t = time.perf_counter()
        done = compaction.compact(run.pk)
        took = time.perf_counter() - t
        print(
            f"| {run.agent} ({run.input.get('variant', '')}) | {done:,} | {took:.1f} s "
            f"| {before:,} | {delta_bytes(run):,} |",
            flush=True,
        )


def window(times: list[float], lo: int, hi: int) -> tuple[float, float]:
    part = times[lo - 1 : hi]
    return statistics.median(part) * 1000, statistics.fmean(part) * 1000


def time_history(run: Run, path: str, repeat: int, limit: int | None) -> dict[str, Any]:
    """Median wall and CPU ms of `repeat` histories (`limit`: the first page's, as the API
    and the watch page ask for it), each on a new connection and with no group text of a
    regrouped run in this process's memory."""
    parsed = watch.parse_path(path)
    walls, cpus = [], []
    found = None
    from agentrun.store import codec

    for _ in range(repeat):
        connection.close()  # a cold connection each time, as a page request on a new worker
        codec.forget_groups()  # and no group text read before (regrouped runs)
        t, c = time.perf_counter(), time.process_time()
        found = watch.history(run, parsed, limit=limit)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    assert found is not None
    return {
        "ms": statistics.median(walls) * 1000,
        "cpu": statistics.median(cpus) * 1000,
        "changes": f"{len(found.changes):,}{'+' if found.more else ''}",
        "read": found.snapshots_read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--no-state-agent", action="store_true", help="skip the StateAgent run (minutes)"
    )
    parser.add_argument(
        "--state-agent-only", action="store_true", help="only the StateAgent run(s), no histories"
    )
    parser.add_argument(
        "--state-runs", type=int, default=1, help="StateAgent runs, a row each (the ratio is noisy)"
    )
    parser.add_argument(
        "--interleaved",
        type=int,
        default=0,
        metavar="K",
        help="K more StateAgent measurements with the late and early steps taken in turns "
        "(two runs side by side; a row each)",
    )
    parser.add_argument(
        "--worker-gc",
        action="store_true",
        help="the garbage collector as a worker process sets it (agentrun.celery): startup "
        "objects frozen, a young collection every 10,000 new objects",
    )
    parser.add_argument(
        "--regrouped",
        action="store_true",
        help="regroup the runs' deltas first (agentrun.store.compaction, as a worker does when a "
        "long run ends) and measure the histories on that",
    )
    args = parser.parse_args()
    if args.worker_gc:
        from agentrun.celery import _freeze_startup_objects

        _freeze_startup_objects()
    if connection.vendor != "postgresql":
        sys.exit("set DATABASE_URL to a PostgreSQL database of its own")
    call_command("migrate", verbosity=0)
    Run.objects.filter(input__label=LABEL, parent__isnull=False).delete()
    Run.objects.filter(input__label=LABEL).delete()
    n = args.steps
    print(
        f"PostgreSQL, {n:,} steps per run, GC {'on' if gc.isenabled() else 'off'} "
        f"(thresholds {gc.get_threshold()}, {gc.get_freeze_count():,} objects frozen), "
        f"state cache {settings.AGENTRUN_STATE_CACHE_MB} MB\n"
    )

    runs = {}
    for variant in () if args.state_agent_only else ("grow", "flat"):
        t = time.perf_counter()
        runs[("workload", variant)] = snapshot_chain(variant, n)
        print(
            f"workload ({variant}): {n:,} steps of snapshots written in "
            f"{time.perf_counter() - t:.0f} s",
            flush=True,
        )
    print(
        "\n| agent | steps 51-150: median / mean | last 100: median / mean | ratio (median) "
        "| CPU: steps 51-150 / last 100 (median) | CPU ratio | state at the end |"
    )
    print("|---|---|---|---|---|---|---|")
    state_runs = [("workload_state", "grow")] * args.state_runs
    for agent, variant in () if args.no_state_agent else state_runs:
        t = time.perf_counter()
        run, times, cpu = run_steps(agent, variant, n)
        total = time.perf_counter() - t
        early, late = window(times, 51, 150), window(times, n - 99, n)
        early_cpu, late_cpu = window(cpu, 51, 150), window(cpu, n - 99, n)
        size = Step.objects.filter(run=run, number=n).values_list("state_size", flat=True).first()
        print(
            f"| {agent} ({variant}) | {early[0]:.2f} / {early[1]:.2f} ms | {late[0]:.2f} / "
            f"{late[1]:.2f} ms | {late[0] / early[0]:.2f}x | {early_cpu[0]:.2f} / "
            f"{late_cpu[0]:.2f} ms | {late_cpu[0] / early_cpu[0]:.2f}x | {size / 1e6:.1f} MB "
            f"(run: {total:.0f} s) |",
            flush=True,
        )
        runs[(agent, variant)] = run
    if args.interleaved:
        print(
            f"\n| agent | steps {n - 99:,}-{n:,}: median wall / CPU | steps 51-150 of a second "
            "run, in turns: median wall / CPU | ratio: wall | CPU | state at the end |"
        )
        print("|---|---|---|---|---|---|")
    for _ in range(args.interleaved):
        t = time.perf_counter()
        got = interleaved("workload_state", "grow", n)
        (lw, lc), (ew, ec) = got["late"], got["early"]
        print(
            f"| workload_state (grow) | {lw:.2f} / {lc:.2f} ms | {ew:.2f} / {ec:.2f} ms "
            f"| {lw / ew:.2f}x | {lc / ec:.2f}x | {got['size'] / 1e6:.1f} MB "
            f"(run: {time.perf_counter() - t:.0f} s) |",
            flush=True,
        )
    if args.state_agent_only:
        return

    if args.regrouped:
        regroup(runs.values())
    page = max(50, watch.COUNTED)  # what GET /api/runs/{id}/history and the page ask for
    print(
        f"\n| run | path | first page ({page}): wall / CPU | changes | read "
        "| whole history: wall / CPU | changes | read |"
    )
    print("|---|---|---|---|---|---|---|---|")
    paths = {
        ("workload", "grow"): [
            "memory.notes.note_03",
            "/iteration",
            "messages[0].content",
            "messages[-1].role",
            "memory.notes.never",
        ],
        ("workload", "flat"): [
            "memory.notes.note_03",
            "/iteration",
            "messages[0].content",
            "memory.notes.never",
        ],
        ("workload_state", "grow"): [
            "memory.notes.note_03",
            "memory.goal",
            "history[1].content",
            "phase",
        ],
    }
    for key, run_paths in paths.items():
        if key not in runs:
            continue
        for path in run_paths:
            first = time_history(runs[key], path, args.repeat, page)
            whole = time_history(runs[key], path, args.repeat, None)
            print(
                f"| {key[0]} ({key[1]}) | `{path}` "
                + "".join(
                    f"| {t['ms']:.0f} / {t['cpu']:.0f} ms | {t['changes']} | {t['read']:,} "
                    for t in (first, whole)
                )
                + "|",
                flush=True,
            )


if __name__ == "__main__":
    main()
