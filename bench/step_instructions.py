"""Instructions per in-process step, counted by valgrind (callgrind): a CPU figure that
the noise of a shared machine does not move, to compare two commits with.

.venv/bin/python bench/step_instructions.py              # grow, 100 and 300 steps
.venv/bin/python bench/step_instructions.py --variant flat --n1 50 --n2 250

Runs the workload agent's steps in-process, as bench/profile_steps.py does, in two
processes under callgrind: one of n1 steps, one of n2. What both share (imports, Django's
setup, the run's creation) cancels out: instructions per step = (I(n2) - I(n1)) /
(n2 - n1). Only the main thread's instructions count, where the steps run: PostgreSQL's
own work, the time spent waiting for it, and the process's clock-driven threads are not
in it. Needs valgrind (Debian: apt-get install valgrind).
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

    from agentrun import engine, services
    from bench.measure import inputs

    settings.AGENTRUN_ENQUEUE = False
    env.truncate()
    run = services.start_run("workload", inputs(variant, n))
    done: list[str] = []
    engine.execute_step(run.pk, 1, chain=float(24 * 3600), observe=lambda o: done.append(o.status))
    assert len(done) == n + 1 and done[-1] == "finished", done[-3:]


def count(variant: str, n: int) -> int:
    """Instructions of a whole process that runs n steps."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                __file__,
                "--child",
                str(n),
                "--variant",
                variant,
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
    p.add_argument("--variant", default="grow")
    p.add_argument("--n1", type=int, default=100)
    p.add_argument("--n2", type=int, default=300)
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args.variant, args.child)
        return 0
    first, second = count(args.variant, args.n1), count(args.variant, args.n2)
    per_step = (second - first) / (args.n2 - args.n1)
    print(
        f"{args.variant}: {first:,} instructions for {args.n1} steps, {second:,} for "
        f"{args.n2}: {per_step:,.0f} a step"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
