"""AgentrunSaver with its database thread against a variant without it (calls on the
caller's thread), each the saver module of a commit, in one process, in alternating turns.
Run by hand, not by pytest:

    DATABASE_URL=postgres://postgres@127.0.0.1:5441/ar_ab .venv/bin/python \\
        bench/ab_saver_thread.py --with-thread 9ae7ae2 --without d9f3d6e [--steps 1000] [--rounds 4]

Without DATABASE_URL it runs on the embedded SQLite (under AGENTRUN_VAR_DIR). The graph is
bench_langgraph.py's (bench/lg_graph.py: a tool-calling agent, one message a super-step,
`durability="sync"`).
Per round and per saver (the order swaps each round): the time per super-step of a sync
`invoke` and of an async `ainvoke`, each minus the graph's without a checkpointer (the
overhead); the mean time of a `put` and a `put_writes` as LangGraph's threads see them
(timed inside the sync run); the latest checkpoint (`get_tuple`) from the main thread, from
a new thread each time, and `aget_tuple`. Figures: medians over rounds, and the median of
the same round's ratios (without the thread / with it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/ar-ab-saver-thread")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ["AGENTRUN_FAULTS"] = "false"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402

from bench.lg_graph import build  # noqa: E402

SAVER = "agentrun/integrations/langgraph/saver.py"


def saver_at(commit: str) -> Any:
    """The saver module as it was at `commit` (loaded under another name)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{SAVER}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(f"/tmp/ab_saver_{commit}.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"ab_saver_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def timing(cls: type) -> type:
    """The saver class, timing its put and put_writes as their callers see them."""

    class Timed(cls):
        def __init__(self) -> None:
            super().__init__()
            self.spent: dict[str, list[float]] = {"put": [], "put_writes": []}

        def put(self, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return super().put(*args, **kwargs)
            finally:
                self.spent["put"].append((time.perf_counter() - started) * 1000)

        def put_writes(self, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return super().put_writes(*args, **kwargs)
            finally:
                self.spent["put_writes"].append((time.perf_counter() - started) * 1000)

    return Timed


def invoke(graph: Any, thread: str, steps: int, *, use_async: bool = False) -> float:
    """ms per super-step of one whole thread."""
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    kwargs = {"durability": "sync"} if graph.checkpointer else {}
    first = {"messages": [HumanMessage("Check each of my orders, one by one, please.")]}
    started = time.perf_counter()
    if use_async:
        result = asyncio.run(graph.ainvoke(first, config, **kwargs))
    else:
        result = graph.invoke(first, config, **kwargs)
    elapsed = time.perf_counter() - started
    assert len(result["messages"]) == steps, len(result["messages"])
    return elapsed * 1000 / steps


def median_ms(fn: Any, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return statistics.median(out)


def on_new_thread(fn: Any) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def case(cls: type, name: str, n: int, steps: int, floor: dict[str, float], repeat: int) -> dict:
    connection.close()
    out: dict[str, float] = {}
    saver = timing(cls)()
    thread = f"{name}-{n}"
    out["overhead_ms"] = invoke(build(steps, saver), thread, steps) - floor["sync"]
    out["put_ms"] = statistics.mean(saver.spent["put"])
    out["put_writes_ms"] = statistics.mean(saver.spent["put_writes"])
    out["aoverhead_ms"] = (
        invoke(build(steps, cls()), f"{thread}-async", steps, use_async=True) - floor["async"]
    )
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    reader = cls()
    assert len(reader.get_tuple(config).checkpoint["channel_values"]["messages"]) == steps
    out["get_tuple_main_ms"] = median_ms(lambda: reader.get_tuple(config), repeat)
    out["get_tuple_thread_ms"] = median_ms(
        lambda: on_new_thread(lambda: reader.get_tuple(config)), repeat
    )
    out["aget_tuple_ms"] = median_ms(lambda: asyncio.run(reader.aget_tuple(config)), repeat)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--with-thread", required=True, help="a commit whose saver has it")
    parser.add_argument("--without", required=True, help="a commit whose saver has not")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    with_thread, without = saver_at(args.with_thread), saver_at(args.without)
    assert hasattr(with_thread, "_DatabaseThread") and not hasattr(without, "_DatabaseThread")
    savers = {"thread": with_thread.AgentrunSaver, "in_place": without.AgentrunSaver}
    tag = f"{time.time():.0f}"
    rounds = []
    for n in range(args.rounds):
        floor = {
            "sync": invoke(build(args.steps, None), "floor", args.steps),
            "async": invoke(build(args.steps, None), "floor", args.steps, use_async=True),
        }
        order = ("thread", "in_place") if n % 2 == 0 else ("in_place", "thread")
        result: dict[str, Any] = {"floor": floor}
        for name in order:
            result[name] = case(savers[name], f"{name}-{tag}", n, args.steps, floor, args.repeat)
        rounds.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
    print(f"{connection.vendor}, {args.steps} steps, {args.rounds} rounds\n")
    print("| figure, ms | with the thread | without | ratio without/with (same round, median) |")
    print("|---|---|---|---|")
    for key in rounds[0]["thread"]:
        with_, without = [r["thread"][key] for r in rounds], [r["in_place"][key] for r in rounds]
        ratio = statistics.median(r["in_place"][key] / r["thread"][key] for r in rounds)

        def cell(v: list[float]) -> str:
            return f"{statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f})"

        print(f"| {key} | {cell(with_)} | {cell(without)} | {ratio:.3f} |")
    sync_floor = [r["floor"]["sync"] for r in rounds]
    async_floor = [r["floor"]["async"] for r in rounds]
    print(
        f"\nNo checkpointer: sync {statistics.median(sync_floor):.3f}, "
        f"async {statistics.median(async_floor):.3f} ms per super-step."
    )


if __name__ == "__main__":
    main()
