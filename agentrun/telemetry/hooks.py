"""What the engine tells telemetry: a step attempt ended (with an outcome) or crashed."""

from __future__ import annotations

import logging
import time
from typing import Any

from agentrun.telemetry import metrics, tracing, webhooks

log = logging.getLogger(__name__)

#: Outcomes after which the step's tool calls are as its attempt left them on record.
ENDED = ("committed", "finished", "failed")


def step_ended(ctx: Any, outcome: str, detail: str = "") -> None:
    """Count and time one step attempt, emit its spans (when traces are on), notify the
    webhook of a failed run. Never raises: what the step did is committed already, and
    telemetry that fails must not make it look like a crash."""
    try:
        _step_ended(ctx, outcome, detail)
    except Exception:
        log.exception("telemetry of step %s of run %s failed", ctx.step.number, ctx.run.pk)


def _step_ended(ctx: Any, outcome: str, detail: str) -> None:
    seconds = time.perf_counter() - ctx.started
    end_ns = time.time_ns()  # the same moment on the wall clock, for the spans
    agent = ctx.run.agent
    metrics.STEP_ATTEMPTS.labels(agent, outcome).inc()
    metrics.STEP_DURATION.labels(agent, outcome).observe(seconds)
    llm = ctx.decision.llm if ctx.decision is not None else None
    if ctx.llm_window is not None and llm:
        started, ended = ctx.llm_window
        model = str(llm.get("model") or "")
        metrics.LLM_DURATION.labels(agent, model).observe((ended - started) / 1e9)
    if outcome in ENDED:
        for tc, _, _ in ctx.acted:
            metrics.TOOL_CALLS.labels(agent, tc.tool, tc.status).inc()
    if tracing.tracer() is not None:
        tracing.emit_step(ctx, outcome, detail, end_ns - int(seconds * 1e9), end_ns)
    if outcome == "failed" and webhooks.enabled():
        webhooks.run_failed(ctx.run.pk)


def step_crashed(ctx: Any, exc: BaseException) -> None:
    step_ended(ctx, "crashed", f"{type(exc).__name__}: {exc}")


def llm_called(ctx: Any, started_ns: int, ended_ns: int) -> None:
    """The step's policy asked its model (wall clock, ns): a chat span, a latency."""
    ctx.llm_window = (started_ns, ended_ns)
