"""A step that waits for an operator is resumed as the same attempt (an approval is no
retry), possibly more than once: each wait is a span of its own, and the attempt's end keeps
the span id derived from the step's row, which re-emission and forks compute."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agentrun.lifecycle import services
from agentrun.models import Step
from agentrun.telemetry import tracing
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db(transaction=True)

TWO_APPROVALS = script(
    calls(
        {"tool": "echo", "args": {"n": 1}, "approval": True},
        {"tool": "echo", "args": {"n": 2}, "approval": True},
    ),
    final(),
)


def test_each_wait_is_a_span_of_its_own_and_the_commit_keeps_the_derived_id(exported):
    operator = make_people()["operator"]
    run = drive(make_run(TWO_APPROVALS))
    for _ in range(2):  # one wait for each call
        assert (run.status, run.wait_reason) == ("waiting", "approval")
        services.decide_approval(run, user=operator, decision="approve")
        run = drive(run)
    assert run.status == "succeeded"

    step = Step.objects.get(run=run, number=1)
    assert step.attempts == 1
    ones = exported.named("step 1")
    outcomes = sorted(s.attributes["agentrun.step.outcome"] for s in ones)
    assert outcomes == ["committed", "waiting", "waiting"]
    assert len({s.span_id for s in ones}) == 3
    (committed,) = [s for s in ones if s.attributes["agentrun.step.outcome"] == "committed"]
    assert committed.span_id == f"{tracing.step_span_id(run.pk, 1, step.attempts):016x}"
    # Each call ran once approved, in the attempt's part that went on to its end or its next
    # wait: under that part's span.
    tools = exported.named("execute_tool echo")
    assert len(tools) == 2 and {t.parent_id for t in tools} <= {s.span_id for s in ones}
    under = [(t.span_id, t.parent_id) for t in tools if t.parent_id == committed.span_id]
    assert len(under) == 1

    # Emitted again from the rows, the committed attempt's span has the same id.
    exported.spans.clear()
    Step.objects.filter(pk=step.pk).update(trace_due_at=timezone.now())
    assert tracing.emit_lost() == 1
    (again,) = exported.named("step 1")
    assert again.span_id == committed.span_id
    assert [(t.span_id, t.parent_id) for t in exported.named("execute_tool echo")] == under
