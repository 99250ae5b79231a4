"""What agentrun tells the tools operators already watch: Prometheus metrics (`metrics`:
the database's truth at scrape time, and what each worker process measures as it runs
steps) and OpenTelemetry traces (`tracing`: a run is a trace, each step, model request and
tool call a span), both fed by `step_ended`, which the engine calls once per step attempt.
"""

from agentrun.telemetry.hooks import llm_called, step_crashed, step_ended

__all__ = ["llm_called", "step_crashed", "step_ended"]
