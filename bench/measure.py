"""One repeat of one in-process case: floor, baseline, engine run, sizes, reads, diffs, fork.

Everything here runs in the bench process after env.setup(); the engine is driven
directly (engine.execute_step with an unlimited chain: each commit claims the next
step and the call goes on; AGENTRUN_ENQUEUE off), so a step's time is from the
return of the previous step's commit to the return of its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from time import perf_counter, process_time
from typing import Any

from bench import env
from bench.stats import steps_summary, summary, timed
from bench.wl import expected_fingerprint, workload


class Aborted(Exception):
    """A case ran past its time budget: its later measurements are not taken."""


def inputs(variant: str, n: int) -> dict[str, Any]:
    return {"variant": variant, "n": n}


# --- the floor: one raw transaction per step with only the step's delta ---------------


def floor_steps(variant: str, n: int, run_no: int) -> list[float]:
    times = []
    with env.raw() as conn:
        for k in range(1, n + 1):
            d = workload.step_delta(k, variant)
            t0 = perf_counter()
            conn.execute(
                f"INSERT INTO {env.FLOOR_TABLE} (run, step, delta) VALUES (%s, %s, %s::jsonb)",
                (run_no, k, json.dumps(d, separators=(",", ":"))),
            )
            conn.commit()
            times.append((perf_counter() - t0) * 1000)
    return times


def floor_state(conn: Any, run_no: int, upto: int, variant: str, keep_all: bool = False) -> Any:
    """The floor's read: fetch the deltas 1..upto and fold them (every state if keep_all)."""
    rows = conn.execute(
        f"SELECT delta FROM {env.FLOOR_TABLE} WHERE run = %s AND step <= %s ORDER BY step",
        (run_no, upto),
    ).fetchall()
    state = workload.initial_state(variant)
    states = [state]
    for (d,) in rows:
        state = workload.apply_delta(state, d, variant)
        if keep_all:
            states.append(state)
    return states if keep_all else state


def floor_timeline(conn: Any, run_no: int) -> list[tuple[int, int]]:
    return conn.execute(
        f"SELECT step, pg_column_size(delta) FROM {env.FLOOR_TABLE} WHERE run = %s ORDER BY step",
        (run_no,),
    ).fetchall()


def floor_delta(conn: Any, run_no: int, step: int) -> Any:
    return conn.execute(
        f"SELECT delta FROM {env.FLOOR_TABLE} WHERE run = %s AND step = %s", (run_no, step)
    ).fetchone()[0]


# --- the same agent code with no persistence ----------------------------------------


def baseline_steps(variant: str, n: int) -> list[float]:
    from agentrun.agents import CallResult, StepContext, get_agent
    from agentrun.tools import ToolContext, get_tool

    agent = get_agent("workload")
    inp = inputs(variant, n)
    state = agent.initial_state(inp)
    times = []
    for k in range(1, n + 1):
        t0 = perf_counter()
        ctx = StepContext("baseline", k, inp, 1)
        decision = agent.decide(state, ctx)
        call = decision.calls[0]
        t = get_tool(call.tool)
        result = t(ToolContext("baseline", k, 0, f"baseline:{k}"), call.args)
        cr = CallResult(
            index=0, tool=call.tool, kind=t.kind, args=call.args, status="ok", result=result
        )
        state = agent.update(state, decision, [cr], ctx)
        times.append((perf_counter() - t0) * 1000)
    assert workload.fingerprint(state) == expected_fingerprint(variant, n), (
        "baseline state is wrong"
    )
    return times


# --- the engine ------------------------------------------------------------------------


def engine_steps(
    run_id: Any,
    first: int,
    last: int,
    deadline: float,
    cpu: list[float] | None = None,
    start: float | None = None,
) -> list[float]:
    """Steps first..last (the final "done" step included) through the in-process
    executor: `engine.execute_step` with an unlimited chain, so each commit claims the
    next step and the loop goes on. Wall times in ms, commit to commit (the first from
    `start`, default the call).

    `cpu`, when given, receives this process's CPU time per step (ms): the rest of the
    wall time is spent waiting (for PostgreSQL, fsync, or a CPU on a busy machine).
    """
    from agentrun import engine

    times: list[float] = []
    mark = [perf_counter() if start is None else start, process_time()]

    def observe(out: Any) -> None:
        now, c = perf_counter(), process_time()
        times.append((now - mark[0]) * 1000)
        if cpu is not None:
            cpu.append((c - mark[1]) * 1000)
        mark[:] = [now, c]
        if out.status not in ("committed", "finished"):
            raise RuntimeError(f"step {out.step} of {run_id}: {out}")
        if time.monotonic() > deadline:
            raise Aborted(f"time budget exhausted at step {out.step} of {last}")

    while first + len(times) <= last:
        k = first + len(times)
        out = engine.execute_step(run_id, k, chain=float(24 * 3600), observe=observe)
        if out.status == "finished" or out.status not in ("committed", "finished"):
            break
    if first + len(times) <= last:
        raise RuntimeError(f"{run_id} stopped at step {first + len(times) - 1} of {last}")
    return times


def check_state(state: Any, variant: str, n: int, what: str) -> str:
    got, want = workload.fingerprint(state), expected_fingerprint(variant, n)
    if got != want:
        raise AssertionError(f"{what}: fingerprint {got} != {want} ({variant}, after {n} steps)")
    return got


def diff_display() -> tuple[str, Any, Any]:
    """(name, diff of two snapshots as the diff pages compute it, diff of two loaded states).

    The debugger's `diff_snapshots` is what its diff views call, loading included;
    without the debugger, two `snapshots.load_state` and the engine's structural diff.
    """
    from agentrun.store import snapshots

    try:
        from debugger.diffs import diff_states
        from debugger.states import diff_snapshots
    except ImportError:
        from agentrun.store import delta

        def states(a: Any, b: Any, sa: int, sb: int) -> Any:
            return delta.diff(a, b)

        def snaps(a: Any, b: Any) -> Any:
            return states(snapshots.load_state(a), snapshots.load_state(b), a.size, b.size)

        return "agentrun.store.delta.diff", snaps, states
    return "debugger.states.diff_snapshots", diff_snapshots, diff_states


def one_repeat(variant: str, n: int, run_no: int, reads: int, budget_s: float) -> dict[str, Any]:
    from django.conf import settings

    from agentrun.lifecycle import services
    from agentrun.models import Run, Step
    from agentrun.store import snapshots

    settings.AGENTRUN_ENQUEUE = False
    deadline = time.monotonic() + budget_s
    out: dict[str, Any] = {"variant": variant, "n": n}
    env.truncate()

    floor_ms = floor_steps(variant, n, run_no)
    out["floor"] = steps_summary(floor_ms)
    out["floor_bytes"] = env.table_sizes((env.FLOOR_TABLE,))[env.FLOOR_TABLE]
    base_ms = baseline_steps(variant, n)
    out["baseline"] = steps_summary(base_ms)

    run = services.start_run("workload", inputs(variant, n))
    cpu: list[float] = []
    try:
        ms = engine_steps(run.pk, 1, n + 1, deadline, cpu)
    except Aborted as exc:
        out["aborted"] = str(exc)
        return out
    step_ms = ms[:n]  # step n + 1 only answers "done"
    out["engine"] = steps_summary(step_ms)
    out["engine"]["done_step"] = ms[n]
    out["engine"]["total_s"] = sum(ms) / 1000
    out["engine_cpu"] = steps_summary(cpu[:n])
    out["overhead"] = {
        "median": out["engine"]["median"] - out["baseline"]["median"],
        "last10": out["engine"]["last10"] - out["baseline"]["last10"],
    }
    out["step_ms"] = [round(x, 3) for x in step_ms]
    run.refresh_from_db()
    assert run.status == "succeeded", run.status

    # Stored bytes, before any read or fork adds anything.
    sizes = env.table_sizes(env.PROJECT_TABLES)
    out["sizes"] = sizes
    out["bytes_per_step"] = sum(s["total"] for s in sizes.values()) / n
    out["floor_bytes_per_step"] = out["floor_bytes"]["total"] / n
    out["snapshot_kinds"] = _snapshot_kinds(run.pk)
    out["keyframe_steps"] = _keyframe_steps(run.pk)
    # Rows a load reads: from the snapshot's keyframe to the snapshot itself.
    out["chain_rows"] = {
        label: snap.seq - snap.keyframe_seq + 1
        for label, snap in (
            ("half", snapshots.get(run.pk, n // 2, "post")),
            ("n", snapshots.get(run.pk, n, "post")),
        )
    }

    final = snapshots.load(run.pk, n, "post")
    out["fingerprint_final"] = check_state(
        final, variant, n, "final state (reloaded post snapshot)"
    )
    half = n // 2

    # Reads.
    t, steps_rows = timed(lambda: list(Step.objects.filter(run=run).order_by("number")), reads)
    assert len(steps_rows) == n + 1
    out["read_timeline_steps"] = summary(t)
    from debugger import timeline

    t, rows = timed(lambda: timeline.rows(Run.objects.get(pk=run.pk)), reads)
    assert len(rows) == n + 1
    out["read_timeline_rows"] = summary(t)
    t, state_half = timed(lambda: snapshots.load(run.pk, half, "post"), reads)
    out["read_snapshot_half"] = summary(t)
    out["fingerprint_half"] = check_state(state_half, variant, half, f"snapshot at step {half}")
    t, hist = timed(lambda: snapshots.history(run.pk), max(1, reads // 2))
    out["read_history"] = summary(t)
    assert len(hist) == 2 * (n + 1)
    check_state(hist[-1][1], variant, n, "last state of history")
    assert hist[2 * half - 1][0].seq == 2 * half + 1
    check_state(hist[2 * half - 1][1], variant, half, "history at step n/2")
    del hist

    # The floor's reads, for ratios.
    # (on one open connection, as Django's is)
    fconn = env.raw(autocommit=True)
    out["floor_timeline"] = summary(timed(lambda: floor_timeline(fconn, run_no), reads)[0])
    t, fstate = timed(lambda: floor_state(fconn, run_no, half, variant), reads)
    out["floor_snapshot_half"] = summary(t)
    check_state(fstate, variant, half, "floor state at n/2")
    out["floor_history"] = summary(
        timed(lambda: floor_state(fconn, run_no, n, variant, keep_all=True), max(1, reads // 2))[0]
    )
    out["floor_diff"] = summary(timed(lambda: floor_delta(fconn, run_no, n), reads)[0])
    fconn.close()

    # Diffs.
    name, diff_snaps, diff = diff_display()
    out["diff_impl"] = name

    def pair(a_step: int, a_at: str, b_step: int, b_at: str) -> Any:
        # As the diff views: the two snapshot rows, then the one function they call.
        return diff_snaps(snapshots.get(run.pk, a_step, a_at), snapshots.get(run.pk, b_step, b_at))

    t, d = timed(lambda: pair(n, "pre", n, "post"), reads)
    out["diff_step_n"] = summary(t)
    out["diff_step_n_changes"] = _changes(d)
    pre, post = snapshots.load(run.pk, n, "pre"), snapshots.load(run.pk, n, "post")
    sizes_n = (snapshots.get(run.pk, n, "pre").size, snapshots.get(run.pk, n, "post").size)
    out["diff_step_n_only"] = summary(timed(lambda: diff(pre, post, *sizes_n), reads)[0])
    q1, q3 = max(1, n // 4), max(1, 3 * n // 4)
    t, d = timed(lambda: pair(q1, "post", q3, "post"), reads)
    out["diff_any"] = summary(t)
    out["diff_any_pair"] = f"post {q1} vs post {q3}"
    out["diff_any_changes"] = _changes(d)

    # Fork from the state at n/2 (post snapshot of step n/2): the fork runs steps n/2+1 .. n+1.
    t0 = perf_counter()
    fork = services.fork_run(run, step=half, at="post", reason="bench")
    try:
        fork_ms = engine_steps(fork.pk, half + 1, n + 1, deadline, start=t0)
    except Aborted as exc:
        out["aborted"] = f"fork: {exc}"
        return out
    out["fork_first_step"] = fork_ms[0]
    out["fork_complete"] = (perf_counter() - t0) * 1000
    fork.refresh_from_db()
    assert fork.status == "succeeded", fork.status
    out["fingerprint_fork"] = check_state(
        snapshots.load(fork.pk, n, "post"), variant, n, "fork's final state"
    )
    # The floor's fork: read the state at n/2, then n/2 steps of agent code + floor commit.
    per_step = out["floor"]["median"] + out["baseline"]["median"]
    out["floor_fork_first_step"] = out["floor_snapshot_half"]["median"] + per_step
    out["floor_fork_complete"] = out["floor_snapshot_half"]["median"] + (n - half) * per_step
    return out


def _changes(d: Any) -> int:
    return len(d.changes) if hasattr(d, "changes") else len(d)


def _keyframe_steps(run_id: Any) -> list[str]:
    from agentrun.models import Snapshot

    rows = Snapshot.objects.filter(run_id=run_id, kind="full").order_by("seq")
    return [f"{step} {at}" for step, at in rows.values_list("step", "at")]


def _snapshot_kinds(run_id: Any) -> dict[str, int]:
    from django.db.models import Count

    from agentrun.models import Snapshot

    return dict(
        Snapshot.objects.filter(run_id=run_id)
        .order_by()
        .values_list("kind")
        .annotate(c=Count("id"))
    )


# --- the dashboard team's page benchmark ---------------------------------------------------

PAGE_LINE = re.compile(
    r"^(?P<label>\S.*?)\s+median\s+(?P<median>[\d.]+) ms\s+\(min (?P<min>[\d.]+), max (?P<max>[\d.]+)\)"
)


def pages(timeout_s: float) -> dict[str, Any]:
    """Run bench/bench_pages.py (someone else's) against the bench database; parse its medians.

    Returns {"available": False} when the script is absent. It inserts its own 1,000-step
    grow run; the tables are truncated before and after.
    """
    script = env.ROOT / "bench" / "bench_pages.py"
    if not script.is_file():
        return {"available": False}
    env.truncate()
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=env.ROOT,
        env={**os.environ, **env.environment(), "AGENTRUN_ENQUEUE": "false"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    env.truncate()
    rows = []
    for line in proc.stdout.splitlines():
        m = PAGE_LINE.match(line)
        if m:
            rows.append(
                {
                    "label": m["label"].strip(),
                    "median": float(m["median"]),
                    "min": float(m["min"]),
                    "max": float(m["max"]),
                    "n": 7,
                }
            )
    out: dict[str, Any] = {"available": True, "rows": rows, "returncode": proc.returncode}
    detail = [r for r in rows if r["label"].startswith("run detail page")]
    if detail:
        out["run_detail"] = detail[0]
    if proc.returncode != 0 or not detail:
        out["error"] = (proc.stderr or proc.stdout)[-2000:]
    return out
