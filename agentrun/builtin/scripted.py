"""The `scripted` agent: its decisions come from the run input.

    {"goal": "...", "steps": [
        {"thought": "look it up", "calls": [{"tool": "echo", "args": {"q": 1}}]},
        {"thought": "pay", "calls": [{"tool": "ledger_write", "args": {...},
                                      "approval": true, "fault": "crash_after"}]},
        {"thought": "done", "final": "paid"}]}

Step k of the run (forks included, they number on from their fork point)
takes steps[k-1].
"""

from __future__ import annotations

from typing import Any

from agentrun.agents import (
    AgentError,
    Call,
    Decision,
    InvalidInput,
    StateAgent,
    StepContext,
    register,
)
from agentrun.tools import REGISTRY

FAULTS = ("crash_before", "crash_after")
MAX_SCRIPT_STEPS = 10_000


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise InvalidInput(f"{where} must be an object")
    unknown = sorted(set(call) - {"tool", "args", "approval", "fault"})
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(unknown)}")
    name = call.get("tool")
    if not isinstance(name, str) or name not in REGISTRY:
        raise InvalidInput(
            f"{where}.tool: unknown tool {name!r} (known: {', '.join(sorted(REGISTRY))})"
        )
    args = call.get("args", {})
    problem = REGISTRY[name].check_args(args)
    if problem:
        raise InvalidInput(f"{where}.args: {problem}")
    if not isinstance(call.get("approval", False), bool):
        raise InvalidInput(f"{where}.approval must be true or false")
    if call.get("fault") not in (None, *FAULTS):
        raise InvalidInput(f"{where}.fault must be one of {', '.join(FAULTS)}")


def _check_step(step: Any, where: str) -> None:
    if not isinstance(step, dict):
        raise InvalidInput(f"{where} must be an object")
    unknown = sorted(set(step) - {"thought", "calls", "final", "rationale"})
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(unknown)}")
    if not isinstance(step.get("thought", ""), str):
        raise InvalidInput(f"{where}.thought must be a string")
    has_calls, has_final = "calls" in step, "final" in step
    if has_calls == has_final:
        raise InvalidInput(f"{where} needs exactly one of calls or final")
    if has_final and not isinstance(step["final"], str):
        raise InvalidInput(f"{where}.final must be a string")
    if has_calls:
        if not isinstance(step["calls"], list):
            raise InvalidInput(f"{where}.calls must be a list")
        for i, call in enumerate(step["calls"]):
            _check_call(call, f"{where}.calls[{i}]")


@register
class ScriptedAgent(StateAgent):
    """Follows the script in its input, step by step."""

    name = "scripted"
    description = "Decisions come from the run input: any behaviour without an LLM."

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        unknown = sorted(set(input) - {"goal", "steps"})
        if unknown:
            raise InvalidInput(f"unknown key(s) {', '.join(unknown)}")
        if not isinstance(input.get("goal"), str):
            raise InvalidInput("goal must be a string")
        steps = input.get("steps")
        if not isinstance(steps, list) or not steps:
            raise InvalidInput("steps must be a non-empty list")
        if len(steps) > MAX_SCRIPT_STEPS:
            raise InvalidInput(f"steps: at most {MAX_SCRIPT_STEPS} steps")
        for i, step in enumerate(steps):
            _check_step(step, f"steps[{i}]")

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        steps = ctx.input["steps"]
        if not 1 <= ctx.step <= len(steps):
            raise AgentError(f"the script has no step {ctx.step} (it has {len(steps)})")
        step = steps[ctx.step - 1]
        if "final" in step:
            return Decision(
                thought=step.get("thought", ""),
                rationale=step.get("rationale", ""),
                final=step["final"],
            )
        return Decision(
            thought=step.get("thought", ""),
            rationale=step.get("rationale", ""),
            calls=[
                Call(c["tool"], c.get("args", {}), bool(c.get("approval")), c.get("fault"))
                for c in step["calls"]
            ],
        )
