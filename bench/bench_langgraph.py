"""agentrun's LangGraph saver side by side with LangGraph's `PostgresSaver`, on one PostgreSQL.
Run by hand, not by pytest:

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_langgraph_bench \\
        .venv/bin/python bench/bench_langgraph.py [--steps 1000] [--rounds 3] [--out FILE]

Give it a database of its own: it creates and migrates it, creates PostgresSaver's tables
(`setup()`) and empties both savers' tables before each case. The graph is a tool-calling
agent as LangGraph's tutorials build it: a `messages` channel (`add_messages`) that grows by
one message a super-step, a model node (a deterministic stand-in that asks for a tool call
until the thread has `--steps` super-steps, then answers) and LangGraph's `ToolNode`. One
`invoke` runs the whole thread, `durability="sync"` (each checkpoint written before the next
super-step starts).

Per round, the cases take turns: the graph without a checkpointer (the floor: LangGraph and
the nodes alone), then with `PostgresSaver` and with `AgentrunSaver`, in turns (each
round starts with the other one). For each saver: the time per
super-step, and its overhead (minus the floor's of the same round); after `VACUUM ANALYZE`,
the saver's tables' total bytes (heap, TOAST, indexes) per super-step, less the
same tables' bytes when empty; then reading the
thread's history back with `get_state_history` (LangGraph's snapshots, as Studio and a
user's code read it) and with the saver's `list` alone, LangGraph's own share of the
former (the same graph over a saver handing back the tuples `list` returned, read
already: what no saver can go below), and the latest checkpoint
(`get_tuple`, what each `invoke` on a thread starts with); and, for agentrun, the thread's
history as the debugger loads it (every snapshot's state of the thread's run). Every history
read back is checked
against the last checkpoint's messages. Figures: median (min-max) over rounds; reads median
over repeats. The ratios are of figures from the same round, then their median.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
DATABASE_URL = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ar_langgraph_bench"
)
os.environ["DATABASE_URL"] = DATABASE_URL
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/ar-langgraph-bench")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ["AGENTRUN_FAULTS"] = "false"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import psycopg  # noqa: E402


def _create_database() -> None:
    name = urlparse(DATABASE_URL).path.lstrip("/")
    admin = urlparse(DATABASE_URL)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


_create_database()

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.store import snapshots  # noqa: E402
from bench.lg_graph import build  # noqa: E402

AGENTRUN_TABLES = (
    "agentrun_run",
    "agentrun_runlabel",
    "agentrun_step",
    "agentrun_snapshot",
    "agentrun_toolcall",
    "agentrun_event",
)
POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


class Replayed(BaseCheckpointSaver):
    """A saver that hands back checkpoint tuples it was given (read already)."""

    def __init__(self, tuples: list[Any]) -> None:
        super().__init__()
        self.tuples = tuples

    def list(self, config: Any, **kwargs: Any) -> Any:
        return iter(self.tuples)

    def get_tuple(self, config: Any) -> Any:
        return self.tuples[0]


def run_thread(graph: Any, thread: str, steps: int) -> tuple[float, dict[str, Any]]:
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    started = time.perf_counter()
    # (durability with no checkpointer fails in LangGraph's loop: the floor runs without it)
    durability = {"durability": "sync"} if graph.checkpointer else {}
    result = graph.invoke(
        {"messages": [HumanMessage("Check each of my orders, one by one, please.")]},
        config,
        **durability,
    )
    elapsed = time.perf_counter() - started
    assert len(result["messages"]) == steps, len(result["messages"])
    return elapsed, config


def empty(tables: tuple[str, ...]) -> None:
    connection.close()
    with psycopg.connect(DATABASE_URL) as conn:
        # The event log refuses TRUNCATE (a trigger): a superuser skips triggers, as a replica.
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


def table_bytes(tables: tuple[str, ...]) -> dict[str, int]:
    """Each table's bytes, indexes and TOAST included (bench/env.py's sizes)."""
    from bench import env

    connection.close()
    return {name: size["total"] for name, size in env.table_sizes(tables, DATABASE_URL).items()}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What the tables grew by: their files when empty (a page per index) don't count."""
    return {name: size - before.get(name, 0) for name, size in after.items()}


def timed(fn: Any, repeat: int) -> tuple[list[float], Any]:
    out, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        out.append((time.perf_counter() - started) * 1000)
    return out, result


def reads(graph: Any, saver: Any, config: dict[str, Any], steps: int, repeat: int) -> dict:
    last = graph.get_state(config).values["messages"]
    assert len(last) == steps

    def history() -> list[Any]:
        return list(graph.get_state_history(config))

    def listed() -> list[Any]:
        return list(saver.list(config))

    history_ms, states = timed(history, repeat)
    assert len(states) == steps + 1, len(states)
    assert states[0].values["messages"] == last
    assert [len(s.values.get("messages", [])) for s in states[:3]] == [steps, steps - 1, steps - 2]
    list_ms, tuples = timed(listed, repeat)
    assert tuples[0].checkpoint["channel_values"]["messages"] == last
    # LangGraph's own share of get_state_history: the same graph over a saver that hands
    # back these tuples, read already (no saver can do better).
    replayed = build(steps, Replayed(tuples))
    floor_ms, _ = timed(lambda: list(replayed.get_state_history(config)), repeat)
    latest_ms, _ = timed(lambda: saver.get_tuple(config), max(repeat, 5))
    return {
        "history_ms": statistics.median(history_ms),
        "history_floor_ms": statistics.median(floor_ms),
        "list_ms": statistics.median(list_ms),
        "latest_ms": statistics.median(latest_ms),
    }


def round_(steps: int, rounds_no: int, repeat: int) -> dict[str, Any]:
    """One round: the floor, then both savers, in turns (an odd round starts with
    agentrun's), so a slow spell of the shared host doesn't always hit the same one."""
    out: dict[str, Any] = {}
    floor, _ = run_thread(build(steps, None), f"floor-{rounds_no}", steps)
    out["floor_ms"] = floor * 1000 / steps

    def postgres() -> None:
        with PostgresSaver.from_conn_string(DATABASE_URL) as pg:
            empty(POSTGRES_TABLES)
            before = table_bytes(POSTGRES_TABLES)
            graph = build(steps, pg)
            elapsed, config = run_thread(graph, f"pg-{rounds_no}", steps)
            out["postgres"] = {"step_ms": elapsed * 1000 / steps}
            out["postgres"]["bytes"] = grown(before, table_bytes(POSTGRES_TABLES))
            out["postgres"].update(reads(graph, pg, config, steps, repeat))

    def agentrun() -> None:
        empty(AGENTRUN_TABLES)
        before = table_bytes(AGENTRUN_TABLES)
        elapsed, config = run_thread(build(steps, AgentrunSaver()), f"ar-{rounds_no}", steps)
        out["agentrun"] = {"step_ms": elapsed * 1000 / steps}
        out["agentrun"]["bytes"] = grown(before, table_bytes(AGENTRUN_TABLES))
        # Read by a saver of its own, as another process would (nothing kept in memory).
        reader = AgentrunSaver()
        out["agentrun"].update(reads(build(steps, reader), reader, config, steps, repeat))
        # The same history as the debugger loads it: the thread's run, every snapshot's
        # state (what its timeline, diffs and watches read).
        run_id = run_id_for(config["configurable"]["thread_id"])
        debugger_ms, states = timed(lambda: snapshots.history(run_id), repeat)
        assert len(states[-1][1]["messages"]) == steps, len(states[-1][1]["messages"])
        out["agentrun"]["debugger_history_ms"] = statistics.median(debugger_ms)

    for case in (agentrun, postgres) if rounds_no % 2 else (postgres, agentrun):
        case()
    for name in ("postgres", "agentrun"):
        case_out = out[name]
        case_out["overhead_ms"] = case_out["step_ms"] - out["floor_ms"]
        case_out["bytes_per_step"] = sum(case_out["bytes"].values()) / steps
    return out


def cell(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def report(results: list[dict[str, Any]], args: Any, started: str, load: tuple) -> str:
    def series(name: str, key: str) -> list[float]:
        return [r[name][key] for r in results]

    def ratio(key: str, invert: bool = False) -> list[float]:
        return [
            (r["postgres"][key] / r["agentrun"][key])
            if not invert
            else (r["agentrun"][key] / r["postgres"][key])
            for r in results
        ]

    lines = [
        f"`bench/bench_langgraph.py --steps {args.steps} --rounds {args.rounds} --repeat {args.repeat}`, "
        f"started {started}, {len(results)} rounds; PostgreSQL {server_version()}, "
        f"{platform.python_version()}, load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.",
        "",
        "| figure | PostgresSaver | AgentrunSaver | ratio (same round, median) | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    rows = [
        ("time per super-step, ms", "step_ms", "{:.2f}", None, None),
        (
            "overhead per super-step (minus no checkpointer), ms",
            "overhead_ms",
            "{:.2f}",
            "≤ 1.2× PostgresSaver",
            1.2,
        ),
        ("stored bytes per super-step", "bytes_per_step", "{:,.0f}", "≤ ½ PostgresSaver", 0.5),
        (
            f"history of {args.steps} steps, `get_state_history`, ms",
            "history_ms",
            "{:,.1f}",
            "≥ 100× faster",
            100,
        ),
        (
            f"history of {args.steps} steps, saver `list` alone, ms",
            "list_ms",
            "{:,.1f}",
            None,
            None,
        ),
        (
            "`get_state_history` over tuples read already (LangGraph's own share), ms",
            "history_floor_ms",
            "{:,.1f}",
            None,
            None,
        ),
        ("latest checkpoint, `get_tuple`, ms", "latest_ms", "{:.2f}", None, None),
    ]
    for label, key, fmt, target, limit in rows:
        pg, ar = series("postgres", key), series("agentrun", key)
        if key in ("history_ms", "list_ms", "latest_ms", "history_floor_ms"):
            r = statistics.median(ratio(key))
            if r >= 10:
                shown = f"{r:,.0f}× faster"
            else:
                shown = f"{r:.2f}× faster" if r >= 1 else f"{1 / r:.2f}× slower"
            verdict = "" if limit is None else ("**met**" if r >= limit else "**missed**")
        else:
            r = statistics.median(ratio(key, invert=True))
            shown = f"{r:.2f}×"
            verdict = "" if limit is None else ("**met**" if r <= limit else "**missed**")
        lines.append(
            f"| {label} | {cell(pg, fmt)} | {cell(ar, fmt)} | {shown} | {target or '–'} | {verdict or '–'} |"
        )
    debugger = [r["agentrun"]["debugger_history_ms"] for r in results]
    faster = statistics.median(
        r["postgres"]["history_ms"] / r["agentrun"]["debugger_history_ms"] for r in results
    )
    lines.append(
        f"| history of {args.steps} steps as agentrun's debugger loads it (every snapshot's "
        "state) against PostgresSaver's `get_state_history`, ms "
        f"| {cell(series('postgres', 'history_ms'), '{:,.1f}')} | {cell(debugger, '{:,.1f}')} "
        f"| {faster:,.0f}× faster | ≥ 100× faster | {'**met**' if faster >= 100 else '**missed**'} |"
    )
    lines += [
        "",
        f"No checkpointer (the floor): {cell([r['floor_ms'] for r in results])} ms per super-step.",
        "",
        "Bytes per table, last round: PostgresSaver "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(results[-1]["postgres"]["bytes"].items()))
        + "; AgentrunSaver "
        + ", ".join(f"{k} {v:,}" for k, v in sorted(results[-1]["agentrun"]["bytes"].items()))
        + ".",
    ]
    return "\n".join(lines) + "\n"


def server_version() -> str:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
    return f"{version} (fsync={fsync}, synchronous_commit={sync})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="reads per round")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "langgraph.json")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    with PostgresSaver.from_conn_string(DATABASE_URL) as pg:
        pg.setup()
    started = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())
    load = os.getloadavg()
    results = []
    for i in range(args.rounds):
        results.append(round_(args.steps, i, args.repeat))
        print(json.dumps(results[-1], default=str), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(report(results, args, started, load))


if __name__ == "__main__":
    main()
