"""The "workload_state" agent: the shared workload's steps on the typed AgentState.

Like `bench.agent`'s plain-dict agent, step k decides one read-tool call whose result is
`workload.step_delta(k, variant)`, but the state is the typed `AgentState` of
`agentrun.agents.StateAgent`: every step records the decision, the assistant's tool-call
message, the tool-call record (with the 2 KB result) and the tool message, and writes the
step's note into memory.notes (16 slots, as in the workload's grow variant). Step n + 1
answers "done". Input: {"goal": ..., "variant": "grow" | "flat", "n": <steps>}. Load it in
a worker with AGENTRUN_AGENT_MODULES=bench.state_agent.
"""

from __future__ import annotations

from typing import Any

from agentrun.agents import (
    Call,
    CallResult,
    Decision,
    StateAgent,
    StepContext,
    register,
)
from agentrun.state import AgentState
from agentrun.tools import ToolContext, tool
from bench.agent import check_workload_input
from bench.wl import workload

TOOL = "workload_state_step"


@tool(name=TOOL, kind="read")
def workload_state_step(ctx: ToolContext, k: int, variant: str) -> dict[str, Any]:
    """Step k's note (the workload's) and a short deterministic text: a small read result,
    so the state grows by about 1 KB a step (decision, two messages, the call record)."""
    d = workload.step_delta(k, variant)
    return {"k": k, "note": list(d["note"]), "summary": workload.text(7 * k + 5, 120)}


@register
class WorkloadStateAgent(StateAgent):
    name = "workload_state"
    description = "The shared benchmark workload on the typed AgentState (bench/)."
    tools = (TOOL,)

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        check_workload_input(input)

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        if ctx.step > ctx.input["n"]:
            return Decision(thought="done", final=f"{ctx.input['n']} steps")
        args = {"k": ctx.step, "variant": ctx.input["variant"]}
        return Decision(thought=f"step {ctx.step}", calls=[Call(TOOL, args)])

    def observe(
        self, st: AgentState, decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> None:
        for r in results:
            if r.error is None and isinstance(r.result, dict) and "note" in r.result:
                key, text = r.result["note"]
                st.memory["notes"][key] = text
