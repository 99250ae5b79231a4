"""The "workload" agent: the shared workload played through the real engine.

Its state is exactly the workload's dict. Step k decides one read-tool call,
`workload_step(k, variant)`, whose result is `workload.step_delta(k, variant)` (the
fake LLM + tool output); `update` folds it in with `workload.apply_delta`. Step n + 1
answers "done" without a call and leaves the state as it is, so the post snapshot of
step n is the workload's state after n steps.

Input: {"variant": "grow" | "flat", "n": <steps>}. Load it in a worker with
AGENTRUN_AGENT_MODULES=bench.agent.

With BENCH_TIMING_REDIS set (a redis:// URL), a worker also pushes, for every
execute_step task, [run_id, step, status, t_start, t_end, pid, cpu_ms] to the Redis list
"bench:steps": t_end is taken when the task returns, that is after its commit;
cpu_ms is the worker process's CPU time in the task.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from agentrun.agents import Agent, Call, CallResult, Decision, InvalidInput, StepContext, register
from agentrun.tools import ToolContext, tool
from bench.wl import workload

TOOL = "workload_step"


@tool(name=TOOL, kind="read")
def workload_step(ctx: ToolContext, k: int, variant: str) -> dict[str, Any]:
    """The deterministic fake LLM + tool output of workload step k."""
    return workload.step_delta(k, variant)


def check_workload_input(input: dict[str, Any]) -> None:
    """The workload's input: {"variant": grow|flat, "n": steps}."""
    if input.get("variant") not in workload.VARIANTS:
        raise InvalidInput(f"variant must be one of {', '.join(workload.VARIANTS)}")
    n = input.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInput("n must be a positive integer")


@register
class WorkloadAgent(Agent):
    name = "workload"
    description = "Replays the shared benchmark workload (bench/)."
    tools = (TOOL,)

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        check_workload_input(input)

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        return workload.initial_state(input["variant"])

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        if ctx.step > ctx.input["n"]:
            return Decision(thought="done", final=f"{ctx.input['n']} steps")
        args = {"k": ctx.step, "variant": ctx.input["variant"]}
        return Decision(thought=f"step {ctx.step}", calls=[Call(TOOL, args)])

    def update(
        self, state: dict[str, Any], decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> dict[str, Any]:
        if decision.final is not None:
            return state
        (result,) = results
        if result.error is not None:
            raise RuntimeError(f"{TOOL} failed: {result.error}")
        return workload.apply_delta(state, result.result, ctx.input["variant"])


# --- commit timestamps from inside a worker -------------------------------------------

_started: dict[str, tuple[float, float]] = {}
_redis: dict[int, Any] = {}


def _client() -> Any:
    pid = os.getpid()
    if pid not in _redis:  # one connection per (forked) process
        import redis

        _redis.clear()
        _redis[pid] = redis.Redis.from_url(os.environ["BENCH_TIMING_REDIS"])
    return _redis[pid]


def _on_prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
    _started[task_id] = (time.time(), time.process_time())


def _on_postrun(
    task_id: str = "", task: Any = None, args: Any = None, retval: Any = None, **_: Any
) -> None:
    t_end, c_end = time.time(), time.process_time()
    t_start, c_start = _started.pop(task_id, (t_end, c_end))
    if task is None or task.name != "agentrun.execute_step" or not args:
        return
    row = [
        str(args[0]),
        int(args[1]),
        str(retval),
        t_start,
        t_end,
        os.getpid(),
        (c_end - c_start) * 1000,
    ]
    _client().rpush("bench:steps", json.dumps(row))


if os.environ.get("BENCH_TIMING_REDIS"):
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(_on_prerun, weak=False)
    task_postrun.connect(_on_postrun, weak=False)
