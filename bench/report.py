"""RESULTS.md from the results dict that bench/run.py saves (bench/out/results-*.json)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.wl import ROOT

KB = 1000  # targets in KB are read as 1,000 bytes: the stricter reading

# (key, label, limit, unit, how it is read from the grow N=1000 figures)
TARGETS = [
    ("overhead", "per-step engine overhead, in-process (median)", 2.0, "ms"),
    (
        "e2e_overhead",
        "per-step end to end through Celery + Redis, commit to commit (median, minus the no-persistence agent code)",
        8.0,
        "ms",
    ),
    ("bytes", "stored bytes per step (snapshots, records, events, indexes)", 4 * KB, "B"),
    ("snapshot", "one snapshot (state at step 500)", 20.0, "ms"),
    ("timeline", "timeline metadata (all Step rows)", 50.0, "ms"),
    ("history", "whole history (snapshots.history)", 100.0, "ms"),
    ("fork_first", "fork from 500 → first new step committed", 100.0, "ms"),
    ("fork_complete", "fork from 500 → completion, in-process", 1500.0, "ms"),
    (
        "diff",
        "pre→post diff at step 1000 (as the diff view computes it, loading included)",
        50.0,
        "ms",
    ),
    ("page", "run detail page server time", 150.0, "ms"),
    ("throughput", "trivial steps/s with 2 workers", 100.0, "steps/s"),
    ("flat_same", "flat: per-step overhead at N=1000 within 25% of N=50", 1.25, "×"),
    ("flat_bytes", "flat: stored bytes per step at N=1000", 4 * KB, "B"),
]


# --- environment facts -----------------------------------------------------------------


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "cpu_start": cpu_times(),
    }
    try:
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["memory_gb"] = round(int(mem) / 1024 / 1024, 1)
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        models = [
            line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
        ]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        pass
    info["commit"] = code_version()
    return info


def code_version() -> str:
    """HEAD, plus the runtime files that differ from it (the tree is shared and changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "agentrun", "debugger"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
        changed = sorted({line[3:].strip() for line in dirty if line.strip()})
        return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def cpu_times() -> list[int]:
    """The aggregate line of /proc/stat: user nice system idle iowait irq softirq steal."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except (OSError, ValueError):
        return []


def cpu_share(start: list[int], end: list[int]) -> dict[str, float]:
    """Over the run, % of CPU time that was stolen by the hypervisor, idle, or busy."""
    if len(start) < 8 or len(end) < 8:
        return {}
    d = [b - a for a, b in zip(start, end, strict=True)]
    total = sum(d) or 1
    return {
        "steal": 100 * d[7] / total,
        "idle": 100 * (d[3] + d[4]) / total,
        "busy": 100 * (d[0] + d[1] + d[2] + d[5] + d[6]) / total,
    }


def versions() -> dict[str, str]:
    out = {}
    for name in ("Django", "celery", "kombu", "redis", "psycopg", "psycopg-binary", "deepdiff"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    try:
        import redis

        out["Redis server"] = redis.Redis.from_url(os.environ.get("CELERY_BROKER_URL", "")).info(
            "server"
        )["redis_version"]
    except Exception:  # noqa: BLE001 — a missing fact, not a failure
        pass
    return out


# --- console lines -----------------------------------------------------------------------


def brief(rep: dict[str, Any]) -> str:
    if "engine" not in rep:
        return rep.get("aborted", "?")
    s = (
        f"step {rep['engine']['median']:.2f} ms (floor {rep['floor']['median']:.2f}, "
        f"overhead {rep['overhead']['median']:.2f}, last10 {rep['overhead']['last10']:.2f}), "
        f"{rep['bytes_per_step']:,.0f} B/step"
    )
    if "fork_complete" in rep:
        s += f", fork {rep['fork_first_step']:.0f}/{rep['fork_complete']:.0f} ms"
    return s + (f" ABORTED: {rep['aborted']}" if "aborted" in rep else "")


def brief_e2e(rep: dict[str, Any]) -> str:
    if "commit_to_commit" not in rep:
        return rep.get("aborted", "?")
    c = rep["commit_to_commit"]
    return f"commit→commit {c['median']:.2f} ms (last10 {c['last10']:.2f}), task {rep['task_ms']['median']:.2f} ms"


# --- aggregation ------------------------------------------------------------------------


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


def across(repeats: list[dict[str, Any]], *path: str) -> dict[str, float] | None:
    """A per-repeat number: median and min-max over the repeats."""
    values = [v for v in (_get(r, path) for r in repeats) if isinstance(v, int | float)]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def merged(repeats: list[dict[str, Any]], *path: str) -> dict[str, float] | None:
    """A per-repeat summary of samples: median of medians, min of mins, max of maxes."""
    sums = [s for s in (_get(r, path) for r in repeats) if isinstance(s, dict) and s]
    if not sums:
        return None
    return {
        "median": statistics.median(s["median"] for s in sums),
        "min": min(s["min"] for s in sums),
        "max": max(s["max"] for s in sums),
        "n": sum(s.get("n", 1) for s in sums),
    }


def complete(case: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in case.get("repeats", []) if "aborted" not in r]


# --- formatting ---------------------------------------------------------------------------


def num(x: float | None, unit: str = "ms") -> str:
    if x is None:
        return "–"
    if unit == "B":
        return f"{x:,.0f} B"
    if unit == "steps/s":
        return f"{x:,.1f}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(s: dict[str, float] | None, unit: str = "ms") -> str:
    if not s:
        return "–"
    if s.get("n", 1) <= 1 or s["min"] == s["max"]:
        return num(s["median"], unit)
    return f"{num(s['median'], unit)} ({num(s['min'], unit)}–{num(s['max'], unit)})"


def ratio(a: dict[str, float] | float | None, b: dict[str, float] | float | None) -> str:
    av = a["median"] if isinstance(a, dict) else a
    bv = b["median"] if isinstance(b, dict) else b
    if av is None or not bv:
        return "–"
    return f"{av / bv:,.1f}×"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


# --- the document ----------------------------------------------------------------------------


def _case(results: dict[str, Any], kind: str, variant: str, n: int) -> list[dict[str, Any]]:
    for case in results.get(kind, []):
        if case["variant"] == variant and case["n"] == n:
            return complete(case)
    return []


def target_values(results: dict[str, Any]) -> dict[str, tuple[dict[str, float] | None, str]]:
    """Each target's measured summary and its ratio to the floor."""
    g = _case(results, "in_process", "grow", 1000)
    e = _case(results, "e2e", "grow", 1000)
    f50, f1000 = (
        _case(results, "in_process", "flat", 50),
        _case(results, "in_process", "flat", 1000),
    )
    out: dict[str, tuple[dict[str, float] | None, str]] = {}
    floor = across(g, "floor", "median")
    base = across(g, "baseline", "median")
    out["overhead"] = (
        across(g, "overhead", "median"),
        ratio(across(g, "overhead", "median"), floor),
    )
    e2e = across(e, "commit_to_commit", "median")
    e2e_over = (
        None
        if e2e is None or base is None
        else {k: (v - base["median"] if k != "n" else v) for k, v in e2e.items()}
    )
    out["e2e_overhead"] = (e2e_over, ratio(e2e_over, floor))
    out["bytes"] = (
        across(g, "bytes_per_step"),
        ratio(across(g, "bytes_per_step"), across(g, "floor_bytes_per_step")),
    )
    out["snapshot"] = (
        merged(g, "read_snapshot_half"),
        ratio(merged(g, "read_snapshot_half"), merged(g, "floor_snapshot_half")),
    )
    out["timeline"] = (
        merged(g, "read_timeline_steps"),
        ratio(merged(g, "read_timeline_steps"), merged(g, "floor_timeline")),
    )
    out["history"] = (
        merged(g, "read_history"),
        ratio(merged(g, "read_history"), merged(g, "floor_history")),
    )
    out["fork_first"] = (
        across(g, "fork_first_step"),
        ratio(across(g, "fork_first_step"), across(g, "floor_fork_first_step")),
    )
    out["fork_complete"] = (
        across(g, "fork_complete"),
        ratio(across(g, "fork_complete"), across(g, "floor_fork_complete")),
    )
    out["diff"] = (
        merged(g, "diff_step_n"),
        ratio(merged(g, "diff_step_n"), merged(g, "floor_diff")),
    )
    out["page"] = ((results.get("pages") or {}).get("run_detail"), "–")
    tp = [t for t in results.get("throughput", []) if t["workers"] == 2]
    out["throughput"] = (
        {
            "median": tp[0]["steps_per_s"],
            "min": tp[0]["steps_per_s"],
            "max": tp[0]["steps_per_s"],
            "n": 1,
        }
        if tp
        else None,
        "–",
    )
    o50, o1000 = across(f50, "overhead", "median"), across(f1000, "overhead", "median")
    same = (
        {"median": o1000["median"] / o50["median"], "min": 0, "max": 0, "n": 1}
        if o50 and o1000 and o50["median"] > 0
        else None
    )
    c50, c1000 = across(f50, "engine_cpu", "median"), across(f1000, "engine_cpu", "median")
    if same and c50 and c1000:
        same["cpu_ratio"] = c1000["median"] / c50["median"]
    out["flat_same"] = (same, "–")
    out["flat_bytes"] = (
        across(f1000, "bytes_per_step"),
        ratio(across(f1000, "bytes_per_step"), across(f1000, "floor_bytes_per_step")),
    )
    return out


def render(results: dict[str, Any]) -> str:
    m, pg, v = results["machine"], results["postgres"], results["versions"]
    lines = [
        "# Benchmark results",
        "",
        f"Generated by `{results['command']}` ({results['mode']} mode) — started {results['started']}, "
        f"finished {results.get('finished', '?')} (UTC). Regenerate with the same command (bench/README.md).",
        "",
        f"- **Machine**: {m.get('nproc')} cores ({m.get('cpu', '?')}), {m.get('memory_gb', '?')} GB RAM, "
        f"Linux {m.get('kernel')}, Python {m.get('python')}; load average at start "
        f"{' / '.join(f'{x:.2f}' for x in m.get('loadavg_start', []))}, at end "
        f"{' / '.join(f'{x:.2f}' for x in m.get('loadavg_end', []))}; over the run the CPUs were "
        + (
            ", ".join(f"{v:.0f}% {k}" for k, v in m["cpu_share"].items())
            if m.get("cpu_share")
            else "?"
        )
        + " (shared, noisy machine: steal is time the hypervisor gave to other guests).",
        f"- **PostgreSQL** {pg['version']}: fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}, "
        f"full_page_writes={pg['full_page_writes']}, wal_sync_method={pg['wal_sync_method']}, "
        f"shared_buffers={pg['shared_buffers']}, TOAST compression {pg['default_toast_compression']}.",
        "- **Packages**: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"- **Code**: {_code(results)}; workload `{results['workload']['path']}` "
        f"(sha256 {results['workload']['sha256'][:16]}…, bench/workload.py copy "
        f"{'identical' if results['workload']['copy_matches'] else 'DIFFERS'}).",
        "",
        "Each cell is the median with (min–max). Per-step figures: median over the steps of a run, then "
        "median (min–max) over repeated runs; single-run cells show the median only, see the p90/worst "
        "columns for the spread over steps. Reads: median (min–max) over repeated calls. "
        "**×floor** divides by the floor measured in the same repeat: one raw psycopg transaction per "
        "step inserting only the step's delta (`json.dumps(workload.step_delta(k))`) into a plain "
        "table `bench_floor(run int, step int, delta jsonb)`, same durability. 1 KB = 1,000 B.",
        "",
    ]
    if results.get("errors"):
        lines += ["**Errors during this run:**", ""] + [f"- {e}" for e in results["errors"]] + [""]
    lines += _targets(results)
    lines += _per_step(results)
    lines += _e2e(results)
    lines += _bytes(results)
    lines += _reads(results)
    lines += _throughput(results)
    lines += _pages(results)
    lines += _definitions(results)
    return "\n".join(lines) + "\n\n" + sections()


# The benchmarks run by hand (bench/README.md) each leave a dated section in bench/results/.
# RESULTS.md holds the current ones, the newest of each topic, in this order; the older ones
# stay in their files, listed at its end with their anchors, so links to them still land.
RESULTS_DIR = Path(__file__).with_name("results")
CURRENT = (
    "2026-11-28-step-and-llm-bound.md",
    "2026-11-28-long-runs-and-histories.md",
    "2026-11-27-regrouped.md",
    "2026-11-27-keyframes-and-reads.md",
    "2026-11-26-purge.md",
    "2026-11-26-export.md",
)
# Where RESULTS.md's generated tables end and the sections begin.
SECTIONS_START = "<!-- sections: bench/report.py CURRENT, then the older results -->"


def sections() -> str:
    """The LLM-bound benchmark's latest run, if any, the current sections, the older ones' index."""
    parts = [
        SECTIONS_START,
        "The sections below are the benchmarks run by hand, the newest of each topic, each with\n"
        "the commands that produced it; their files, and the older results listed at the end, are\n"
        "in `bench/results/`.",
    ]
    # bench/llm_bench.py writes its latest run here; once kept, it becomes a dated section.
    llm = Path(__file__).with_name("llm_results.json")
    if llm.exists():
        parts.append('<a id="llm-bound-runs"></a>\n\n' + json.loads(llm.read_text())["markdown"])
    parts += [(RESULTS_DIR / name).read_text().strip() for name in CURRENT]
    parts.append(_older(set(re.findall(r'<a id="([^"]+)">', "\n".join(parts)))))
    return "\n\n".join(parts) + "\n"


def _older(anchors_shown: set[str]) -> str:
    lines = [
        "## Older results",
        "",
        "Earlier measurements, each in a dated file of `bench/results/` with its command, commit",
        "and machine. The figures above replace them where they measure the same thing.",
        "",
    ]
    for path in sorted(RESULTS_DIR.glob("*.md")):
        if path.name in CURRENT:
            continue
        text = path.read_text()
        title = re.search(r"^## (.+)$", text, re.M)
        anchors = "".join(
            f'<a id="{a}"></a>'
            for a in re.findall(r'<a id="([^"]+)">', text)
            if a not in anchors_shown
        )
        lines.append(f"- {anchors}[{title[1] if title else path.stem}](results/{path.name})")
    return "\n".join(lines)


def rewrite_sections(path: Path) -> None:
    """Rewrite the sections of an existing RESULTS.md, keeping its generated tables."""
    text = path.read_text()
    head = text.split(SECTIONS_START, 1)[0].rstrip("\n")
    path.write_text(head + "\n\n" + sections())


def _code(results: dict[str, Any]) -> str:
    """The commit each phase ran (the bench process loads the code at start, workers later)."""
    code = results.get("code") or {"in-process": results["machine"].get("commit", "?")}
    if len(set(code.values())) == 1:
        return "commit " + next(iter(code.values()))
    return "; ".join(f"{phase} ran commit {c}" for phase, c in code.items())


def _targets(results: dict[str, Any]) -> list[str]:
    vals = target_values(results)
    rows = []
    for key, label, limit, unit in TARGETS:
        s, r = vals.get(key, (None, "–"))
        if key == "page" and s is None:
            rows.append([label, f"≤ {num(limit, unit)} ms", "see bench/bench_pages.py", "–", "–"])
            continue
        higher_is_better = key == "throughput"
        if s is None:
            verdict = "not measured" + (" (--quick)" if results["mode"] == "quick" else "")
        else:
            ok = s["median"] >= limit if higher_is_better else s["median"] <= limit
            verdict = "**met**" if ok else "**missed**"
        shown_unit = "ms" if unit == "ms" else unit
        limit_text = (
            ("≥ " if higher_is_better else "≤ ")
            + num(limit, unit)
            + ("" if unit in ("B",) else f" {shown_unit}")
        )
        value = cell(s, unit)
        if key == "flat_same":
            value = f"{s['median']:.2f}× (CPU per step {s.get('cpu_ratio', 0):.2f}×)" if s else "–"
        rows.append([label, limit_text, value, r, verdict])
    return (
        ["## Targets (grow, N = 1000, unless stated)", ""]
        + table(["target", "limit", "measured", "×floor", "verdict"], rows)
        + [""]
    )


def _cases(
    results: dict[str, Any], kind: str
) -> list[tuple[str, int, list[dict[str, Any]], dict[str, Any]]]:
    out = []
    for case in results.get(kind, []):
        out.append((case["variant"], case["n"], complete(case), case))
    return sorted(out, key=lambda c: (c[0] != "grow", c[1]))


def _aborted(case: dict[str, Any]) -> str:
    bad = [r.get("aborted") for r in case.get("repeats", []) if "aborted" in r]
    return f" ⚠ aborted: {bad[0]}" if bad else ""


def _per_step(results: dict[str, Any]) -> list[str]:
    rows = []
    for variant, n, reps, case in _cases(results, "in_process"):
        if not reps:
            rows.append([variant, str(n), "0", "–" + _aborted(case)] + ["–"] * 9)
            continue
        floor = across(reps, "floor", "median")
        eng = across(reps, "engine", "median")
        rows.append(
            [
                variant,
                str(n),
                str(len(reps)),
                cell(eng),
                cell(across(reps, "engine_cpu", "median")),
                cell(across(reps, "engine", "last10")),
                f"{num(across(reps, 'engine', 'p90')['median'])} / {num(across(reps, 'engine', 'max')['median'])}",
                cell(floor),
                cell(across(reps, "baseline", "median")),
                cell(across(reps, "overhead", "median")),
                cell(across(reps, "overhead", "last10")),
                ratio(eng, floor),
                ratio(across(reps, "overhead", "median"), floor) + _aborted(case),
            ]
        )
    return (
        ["## Per-step cost, in-process (engine.execute_step in a loop), ms", ""]
        + table(
            [
                "variant",
                "N",
                "runs",
                "engine step",
                "of which CPU in this process",
                "engine last 10",
                "p90 / worst step",
                "floor step",
                "agent code, no persistence",
                "**overhead**",
                "overhead last 10",
                "step ×floor",
                "overhead ×floor",
            ],
            rows,
        )
        + [
            "",
            "overhead = engine step − the same agent code with no persistence (medians of the same run). "
            "CPU = this process's CPU time in execute_step; the rest of a step's wall time is waiting for "
            "PostgreSQL (round trips, fsync) or for a CPU on a shared machine.",
            "",
        ]
    )


def _e2e(results: dict[str, Any]) -> list[str]:
    rows = []
    floors = {(c["variant"], c["n"]): complete(c) for c in results.get("in_process", [])}
    for variant, n, reps, case in _cases(results, "e2e"):
        if not reps:
            rows.append([variant, str(n), "0", "–" + _aborted(case)] + ["–"] * 7)
            continue
        ip = floors.get((variant, n), [])
        floor, base = across(ip, "floor", "median"), across(ip, "baseline", "median")
        c2c = across(reps, "commit_to_commit", "median")
        over = (
            None
            if not c2c or not base
            else {k: (x - base["median"] if k != "n" else x) for k, x in c2c.items()}
        )
        rows.append(
            [
                variant,
                str(n),
                str(len(reps)),
                cell(c2c),
                cell(across(reps, "commit_to_commit", "last10")),
                cell(over),
                cell(across(reps, "task_ms", "median")),
                cell(across(reps, "task_cpu_ms", "median")),
                cell(across(reps, "queue_gap_ms", "median")),
                cell(across(reps, "first_step")),
                ratio(c2c, floor) + _aborted(case),
            ]
        )
    if not rows:
        return []
    return (
        ["## End to end through a Celery worker on Redis (1 worker process, prefork -c 1), ms", ""]
        + table(
            [
                "variant",
                "N",
                "runs",
                "commit → commit",
                "last 10",
                "**minus agent code**",
                "task (in worker)",
                "task CPU",
                "queue gap",
                "first step (start_run → commit)",
                "×floor",
            ],
            rows,
        )
        + [
            "",
            "commit → commit: time between consecutive steps' commits (`Step.finished_at`) in the worker. A task "
            "goes on with the run's next steps for up to `AGENTRUN_CHAIN_SECONDS` (0.5 s; each commit claims the "
            "next step), then hands the run back to the queue; task and task CPU are per step inside a task; "
            "queue gap = from one task's end to the next one's start (message publish on commit, Redis, prefork "
            "hand-off), paid once per hand-off.",
            "",
        ]
    )


def _bytes(results: dict[str, Any]) -> list[str]:
    rows = []
    for variant, n, reps, _ in _cases(results, "in_process"):
        if not reps:
            continue
        per_table = {}
        for t in (
            "agentrun_snapshot",
            "agentrun_step",
            "agentrun_toolcall",
            "agentrun_event",
            "agentrun_run",
        ):
            tot = statistics.median(
                r["sizes"][t]["total"] / n for r in reps if t in r.get("sizes", {})
            )
            idx = statistics.median(
                r["sizes"][t]["indexes"] / n for r in reps if t in r.get("sizes", {})
            )
            per_table[t] = f"{num(tot, 'B')} (idx {idx:,.0f})"
        kinds = reps[0].get("snapshot_kinds", {})
        keys = reps[0].get("keyframe_steps", [])
        keyframes = (
            f"{len(keys)}: " + ", ".join(keys[:5]) + (", …" if len(keys) > 5 else "")
            if keys
            else "–"
        )
        rows.append(
            [
                variant,
                str(n),
                cell(across(reps, "bytes_per_step"), "B"),
                cell(across(reps, "floor_bytes_per_step"), "B"),
                ratio(across(reps, "bytes_per_step"), across(reps, "floor_bytes_per_step")),
                *per_table.values(),
                ", ".join(f"{k} {c}" for k, c in sorted(kinds.items())),
                keyframes,
            ]
        )
    return (
        ["## Stored bytes per step (after VACUUM ANALYZE; tables truncated before each case)", ""]
        + table(
            [
                "variant",
                "N",
                "**bytes/step**",
                "floor bytes/step",
                "×floor",
                "snapshot",
                "step",
                "toolcall",
                "event",
                "run",
                "snapshot rows by kind",
                "keyframes (step at)",
            ],
            rows,
        )
        + [
            "",
            "bytes/step = sum of pg_total_relation_size (heap + TOAST + indexes) of agentrun_run, _step, _snapshot, "
            "_toolcall, _event after the run (before reads and forks), divided by N; it includes the fixed size of "
            "the empty tables' indexes (a few pages each), which matters at N = 50. Per table: bytes per step, "
            "of which indexes.",
            "",
        ]
    )


def _reads(results: dict[str, Any]) -> list[str]:
    rows, frows = [], []
    for variant, n, reps, _ in _cases(results, "in_process"):
        if not reps:
            continue
        tl, snap, hist = (
            merged(reps, "read_timeline_steps"),
            merged(reps, "read_snapshot_half"),
            merged(reps, "read_history"),
        )
        diff, dany = merged(reps, "diff_step_n"), merged(reps, "diff_any")
        rows.append(
            [
                variant,
                str(n),
                f"{cell(tl)} · {ratio(tl, merged(reps, 'floor_timeline'))}",
                cell(merged(reps, "read_timeline_rows")),
                f"{cell(snap)} · {ratio(snap, merged(reps, 'floor_snapshot_half'))}",
                " / ".join(str(reps[0].get("chain_rows", {}).get(k, "?")) for k in ("half", "n")),
                f"{cell(hist)} · {ratio(hist, merged(reps, 'floor_history'))}",
                f"{cell(diff)} · {ratio(diff, merged(reps, 'floor_diff'))}",
                cell(merged(reps, "diff_step_n_only")),
                f"{cell(dany)} ({reps[0].get('diff_any_pair', '')})",
            ]
        )
        ff, fc = across(reps, "fork_first_step"), across(reps, "fork_complete")
        frows.append(
            [
                variant,
                str(n),
                f"{n // 2} → {n // 2 + 1}",
                f"{cell(ff)} · {ratio(ff, across(reps, 'floor_fork_first_step'))}",
                f"{cell(fc)} · {ratio(fc, across(reps, 'floor_fork_complete'))}",
                reps[0].get("fingerprint_fork", "–"),
            ]
        )
    impl = next(
        (r.get("diff_impl") for c in results.get("in_process", []) for r in complete(c)), "?"
    )
    return (
        ["## Reads and diffs, ms (· ×floor)", ""]
        + table(
            [
                "variant",
                "N",
                "timeline: all Step rows",
                "timeline: debugger.timeline.rows",
                "snapshot at N/2",
                "rows a load reads (N/2 / N)",
                "whole history",
                "pre→post diff of step N",
                "diff only (two separately loaded states)",
                "two snapshots",
            ],
            rows,
        )
        + [
            "",
            f"Diffs use `{impl}`, the function the debugger's diff views call, reading the snapshots included "
            "(one pass over the chain to the pre state; the post is the pre with the post's ops applied). "
            "'diff only' diffs two states loaded separately with `snapshots.load_state`, which share no structure. "
            "Floor counterparts: the floor table's step numbers and sizes (timeline), its deltas 1..N/2 fetched and "
            "folded with workload.apply_delta (snapshot), all N folded keeping every state (history), and "
            "fetching step N's delta (diff).",
            "",
            "## Fork (services.fork_run from the post snapshot of step N/2, sandbox mode, in-process), ms (· ×floor)",
            "",
        ]
        + table(
            [
                "variant",
                "N",
                "steps",
                "fork → first new step committed",
                "fork → completion",
                "fork's final fingerprint",
            ],
            frows,
        )
        + [
            "",
            "Floor (derived): the floor's read of the state at N/2, plus N/2 × (floor step + agent code).",
            "",
        ]
    )


def _throughput(results: dict[str, Any]) -> list[str]:
    rows = [
        [
            str(t["workers"]),
            str(t["runs"]),
            str(t["steps"]),
            f"{t['seconds']:.1f}",
            f"**{t['steps_per_s']:.1f}**",
            str(t["pids"]),
        ]
        for t in results.get("throughput", [])
    ]
    if not rows:
        return []
    return (
        ["## Trivial steps per second (scripted agent, echo steps, concurrent runs on Redis)", ""]
        + table(
            [
                "worker processes (prefork -c 1 each)",
                "concurrent runs",
                "steps committed",
                "seconds",
                "steps/s",
                "processes seen",
            ],
            rows,
        )
        + ["", "seconds = from the first step's start to the last commit, in the workers.", ""]
    )


def _pages(results: dict[str, Any]) -> list[str]:
    pages = results.get("pages") or {}
    if not pages.get("rows"):
        return []
    rows = [[r["label"], cell(r)] for r in pages["rows"]]
    return (
        [
            "## Debugger pages (bench/bench_pages.py, the dashboard team's, run by this command), ms",
            "",
        ]
        + table(["page (server time through Django's test client)", "median (min–max)"], rows)
        + ["", "It inserts its own 1,000-step grow run straight through the snapshot store.", ""]
    )


def _definitions(results: dict[str, Any]) -> list[str]:
    return [
        "## What was run",
        "",
        "- The `workload` agent (bench/agent.py): state = the workload's dict exactly; step k decides one read-tool "
        "call `workload_step(k, variant)` that returns `workload.step_delta(k, variant)`; `update` applies "
        '`workload.apply_delta`. Step N + 1 answers "done" (no call, state unchanged) and finishes the run; it is '
        "not counted in the per-step figures.",
        "- Fingerprints asserted against WORKLOAD.md (or `build_state` where the table has no row): the no-persistence "
        "run, the reloaded post snapshot of step N, the snapshot at N/2, history's states at N/2 and N, the floor's "
        "state at N/2, the fork's final state, and the final state of every Celery run.",
        "- Order of one in-process repeat: TRUNCATE the tables → floor N steps → agent code with no persistence → "
        "engine N + 1 steps → VACUUM ANALYZE and sizes → reads → diffs → fork and its completion.",
    ]


if __name__ == "__main__":
    # After adding or retiring a dated section: the tables stay, the sections are rewritten.
    rewrite_sections(ROOT / "bench" / "RESULTS.md")
