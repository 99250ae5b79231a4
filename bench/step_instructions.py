"""Instructions per in-process step, counted by valgrind (callgrind): a CPU figure that
the noise of a shared machine does not move, to compare two commits with.

.venv/bin/python bench/step_instructions.py              # grow, 100 and 300 steps
.venv/bin/python bench/step_instructions.py --variant flat --n1 50 --n2 250
.venv/bin/python bench/step_instructions.py --agent llm     # llm runs: 20 and 60 runs, 3 steps each

Runs the workload agent's steps in-process, as bench/profile_steps.py does, in two
processes under callgrind: one of n1 steps, one of n2. What both share (imports, Django's
setup, the run's creation) cancels out: instructions per step = (I(n2) - I(n1)) /
(n2 - n1). Only the main thread's instructions count, where the steps run: PostgreSQL's
own work, the time spent waiting for it, and the process's clock-driven threads are not
in it. Needs valgrind (Debian: apt-get install valgrind).

With `--agent llm`, n1 and n2 count `llm` runs (three steps each, bench/llm_bench.py's
input) against bench/fake_llm.py answering at once. The runs are created beforehand in a
process of their own, outside valgrind, and the counted process executes them one after the
other as a worker's task would (bench/profile_llm_steps.py): the steps, the model's
requests and replies over HTTP included, not the runs' creation.
Copy this file into another checkout's bench/ to count that commit's steps.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def child(variant: str, n: int) -> None:
    from bench import env

    env.setup()
    from django.conf import settings

    from agentrun import engine
    from agentrun.lifecycle import services
    from bench.measure import inputs

    settings.AGENTRUN_ENQUEUE = False
    env.truncate()
    run = services.start_run("workload", inputs(variant, n))
    done: list[str] = []
    tracing = _tracing()
    engine.execute_step(run.pk, 1, chain=float(24 * 3600), observe=lambda o: done.append(o.status))
    assert len(done) == n + 1 and done[-1] == "finished", done[-3:]
    if tracing is not None:
        tracing.flush()  # exported here, in the counted thread (see _tracing)


def _tracing():
    """When traces are on (OTEL_* variables; an old commit has no agentrun.telemetry):
    prepared as a worker does at its start. With OTEL_BSP_SCHEDULE_DELAY and
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE above the run's spans, they are all exported by the
    final flush, in the main thread that callgrind counts, not by the batch thread."""
    try:
        from agentrun.telemetry import tracing
    except ImportError:
        return None
    if not tracing.enabled():
        return None
    tracing.prepare()
    return tracing


def create_llm_runs(n: int, ids_file: str) -> None:
    from bench import env

    env.setup()
    from agentrun.lifecycle import services
    from bench.llm_bench import llm_input

    env.truncate()
    ids = [str(services.start_run("llm", llm_input()).pk) for _ in range(n)]
    Path(ids_file).write_text("\n".join(ids))


def llm_child(ids_file: str) -> None:
    from bench import env

    env.setup()
    from django.conf import settings

    from agentrun.builtin import llm
    from bench.profile_llm_steps import _execute

    llm.prepare()
    ids = Path(ids_file).read_text().split()
    steps = _execute(ids, settings.AGENTRUN_CHAIN_SECONDS)
    assert steps == 3 * len(ids), (steps, len(ids))


def count(variant: str, n: int, agent: str = "workload") -> int:
    """Instructions of a whole process that runs n steps (llm: n runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        if agent == "llm":
            ids_file = f"{tmp}/ids"
            subprocess.run(
                [sys.executable, __file__, "--create-llm", str(n), "--ids-file", ids_file],
                check=True,
            )
            what = ["--child-llm", ids_file]
        else:
            what = ["--child", str(n), "--variant", variant]
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                __file__,
                *what,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"valgrind failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        # The main thread's (file -01): the steps run there. The other threads (the lease
        # watchdog, the connection lender) wake by the clock, and under valgrind a step
        # takes 50 times longer: their counts follow the machine, not the code.
        found = re.search(r"^totals: (\d+)", Path(f"{tmp}/out-01").read_text(), re.M)
    if found is None:
        raise SystemExit("no totals in callgrind's output")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--agent", choices=("workload", "llm"), default="workload")
    p.add_argument("--variant", default="grow", help="the workload's (grow, flat)")
    p.add_argument("--n1", type=int, help="steps (llm: runs); default 100 (llm: 20)")
    p.add_argument("--n2", type=int, help="steps (llm: runs); default 300 (llm: 60)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-llm", help=argparse.SUPPRESS)
    p.add_argument("--create-llm", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ids-file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args.variant, args.child)
        return 0
    if args.create_llm is not None:
        create_llm_runs(args.create_llm, args.ids_file)
        return 0
    if args.child_llm is not None:
        llm_child(args.child_llm)
        return 0
    llm = args.agent == "llm"
    n1 = args.n1 if args.n1 is not None else (20 if llm else 100)
    n2 = args.n2 if args.n2 is not None else (60 if llm else 300)
    server = None
    if llm:
        from bench.llm_bench import FakeLLMServer

        server = FakeLLMServer(latency=0.0, rate_limited=0.0, retry_after=1.0)
        os.environ.update(AGENTRUN_LLM_BASE_URL=server.base_url, AGENTRUN_LLM_API_KEY="bench-key")
    try:
        first = count(args.variant, n1, args.agent)
        second = count(args.variant, n2, args.agent)
    finally:
        if server is not None:
            server.stop()
    steps = 3 * (n2 - n1) if llm else n2 - n1
    what = "llm" if llm else args.variant
    unit = "runs" if llm else "steps"
    print(
        f"{what}: {first:,} instructions for {n1} {unit}, {second:,} for {n2}: "
        f"{(second - first) / steps:,.0f} a step"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
