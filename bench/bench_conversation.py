"""Long LLM conversations: what each step stores and costs as the context grows.

    .venv/bin/python bench/bench_conversation.py --turns 100 --page-kb 8
    .venv/bin/python bench/bench_conversation.py --checkout /path/to/older/checkout  # the same there

One `llm` run of `--turns` turns, executed in this process (as a worker's task would, no
broker) against bench/fake_llm.py answering at once: each turn the model calls the tool
`page`, whose result is `--page-kb` KB of words (different every turn: a web page, a file),
then it answers. The context window is big enough that nothing falls out of it. Per step:

- stored bytes: what the step's rows take in PostgreSQL (pg_column_size of the step's row,
  its snapshots' and its tool call's), against the step's new content (its tool result);
- CPU: this thread's CPU time for the step (time.thread_time), the model's HTTP exchange
  included, the fake model's own work not (another process); medians of the steps around
  turn 10 and around turn 100;
- the request as sent: its bytes, which grow with the conversation whatever is stored.

`--checkout` runs the same conversation on another checkout's code (its agentrun on
sys.path first; this file's fake model and tool), for the side by side with older code.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def setup(checkout: Path) -> None:
    sys.path.insert(0, str(checkout))
    os.environ.setdefault(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/agentrun_conversation_bench"
    )
    os.environ.setdefault("BENCH_BROKER_URL", "redis://127.0.0.1:6379/5")
    from bench import env

    env.setup()


WORDS = [f"w{i:03d}" for i in range(600)] + ["the", "and", "of", "a", "to", "in", "is"]


def page_text(n: int, kb: int) -> str:
    """`kb` KB of words, different for every n (deterministic)."""
    rnd = random.Random(n)
    words: list[str] = []
    size = 0
    while size < kb * 1024:
        word = rnd.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[: kb * 1024]


def register_page_tool(kb: int) -> None:
    from agentrun.tools import ToolContext, tool

    @tool(name="page", kind="read", cache=False, parameters={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})  # fmt: skip
    def page(ctx: ToolContext, n: int) -> dict[str, Any]:
        """One page of a long document."""
        return {"n": n, "text": page_text(n, kb)}


class Fake:
    def __init__(self, turns: int) -> None:
        cmd = [sys.executable, str(HERE / "bench" / "fake_llm.py"), "--latency=0",
               f"--tool-turns={turns}", "--tool=page"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        self.base_url = line.split()[-1]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def stored_bytes(run_id: Any) -> dict[int, int]:
    """Per step: pg_column_size of its step row, its snapshots and its tool calls."""
    from django.db import connection

    sql = """
        SELECT n, sum(b) FROM (
            SELECT number AS n, pg_column_size(s.*) AS b FROM agentrun_step s WHERE run_id = %s
            UNION ALL
            SELECT step, pg_column_size(p.*) FROM agentrun_snapshot p WHERE run_id = %s
            UNION ALL
            SELECT st.number, pg_column_size(t.*) FROM agentrun_toolcall t
                JOIN agentrun_step st ON st.id = t.step_id WHERE t.run_id = %s
        ) x GROUP BY n ORDER BY n"""
    with connection.cursor() as cur:
        cur.execute(sql, [run_id, run_id, run_id])
        return {n: int(b) for n, b in cur.fetchall()}


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    from django.conf import settings

    from agentrun import engine

    try:
        from agentrun.lifecycle import services
    except ImportError:  # an older layout
        from agentrun import services  # type: ignore[no-redef]
    from bench import env

    env.truncate()
    fake = Fake(args.turns)
    try:
        settings.AGENTRUN_LLM_BASE_URL = fake.base_url
        os.environ["AGENTRUN_LLM_API_KEY"] = "bench-key"
        run = services.start_run(
            "llm",
            {"goal": "Read every page, then answer.", "tools": ["page"],
             "max_tokens_context": 10_000_000},
        )  # fmt: skip
        cpu: dict[int, float] = {}
        for _ in range(args.turns + 1):
            run.refresh_from_db()
            if run.status not in ("queued", "running"):
                break
            n = run.next_step
            t = time.thread_time()
            engine.execute_step(run.pk, n)
            cpu[n] = (time.thread_time() - t) * 1000
        run.refresh_from_db()
        assert run.status == "succeeded", (run.status, run.error)
        stored = stored_bytes(run.pk)
    finally:
        fake.stop()

    def around(turn: int) -> float:
        return statistics.median(cpu[k] for k in range(turn - 4, turn + 5) if k in cpu)

    new = len(json.dumps({"n": 1, "text": page_text(1, args.page_kb)}))
    late = [stored[k] for k in range(max(2, args.turns - 9), args.turns + 1) if k in stored]
    early = [stored[k] for k in range(2, 12) if k in stored]
    sent = _request_bytes(run, args)
    return {
        "steps": len(cpu),
        "new_content_bytes": new,
        "stored_per_step_early": statistics.median(early),
        "stored_per_step_late": statistics.median(late),
        "stored_total": sum(stored.values()),
        "cpu_ms_turn_10": around(10),
        "cpu_ms_turn_last": around(args.turns - 5),
        "request_bytes_last": sent[-1] if sent else None,
        "request_bytes_total": sum(sent),
    }


def _request_bytes(run: Any, args: argparse.Namespace) -> list[int]:
    """The size of each step's request as sent (rebuilt, or as recorded whole)."""
    from agentrun.models import Step

    out = []
    for step in Step.objects.filter(run=run).order_by("number"):
        try:
            from agentrun.builtin import llm_requests

            out.append(len(llm_requests.rebuild(step).bytes))
        except ImportError:  # older code: the request recorded whole
            request = (step.decision or {}).get("llm", {}).get("request", {})
            out.append(len(json.dumps({"model": request.get("model"),
                                       "messages": request.get("messages")})))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--page-kb", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--checkout", type=Path, default=HERE)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    setup(args.checkout)
    register_page_tool(args.page_kb)
    results = [run_once(args) for _ in range(args.repeat)]
    summary = {
        k: statistics.median(r[k] for r in results)
        for k in results[0]
        if isinstance(results[0][k], int | float)
    }
    summary["checkout"] = str(args.checkout)
    line = (
        f"{args.checkout}: new content {summary['new_content_bytes']:.0f} B/step; stored"
        f" {summary['stored_per_step_early']:.0f} B/step early, {summary['stored_per_step_late']:.0f}"
        f" late ({summary['stored_per_step_late'] / summary['new_content_bytes']:.2f}× the new"
        f" content); CPU {summary['cpu_ms_turn_10']:.2f} ms at turn 10,"
        f" {summary['cpu_ms_turn_last']:.2f} ms at turn {args.turns - 5}"
        f" ({summary['cpu_ms_turn_last'] / summary['cpu_ms_turn_10']:.2f}×); last request"
        f" {summary['request_bytes_last'] / 1024:.0f} KB as sent"
    )
    print(line)
    if args.out:
        args.out.write_text(json.dumps({"runs": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
