"""One definition of an attempt: a claim of the step, except the resume after an operator's
decision (an approval, a call in doubt). A backoff after an error and a crash are attempts."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from agentrun.models import Step
from debugger import timeline
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

APPROVAL = script(
    calls({"tool": "ledger_write", "args": {"account": "a", "amount": 1}, "approval": True}),
    final("paid"),
)


def test_an_approved_step_took_one_attempt(settings):
    operator = make_people()["operator"]
    run = drive(make_run(APPROVAL))
    assert run.wait_reason == "approval"
    services.decide_approval(run, user=operator, decision="approve")
    run = drive(run)
    assert run.status == "succeeded"
    step = Step.objects.get(run=run, number=1)
    assert step.attempts == 1 and step.crashes == 0
    assert not any(r.retried for r in timeline.rows(run))


def test_a_rejected_call_took_one_attempt_too():
    operator = make_people()["operator"]
    run = drive(make_run(APPROVAL))
    services.decide_approval(run, user=operator, decision="reject", comment="no")
    run = drive(run)
    assert run.status == "failed"
    assert Step.objects.get(run=run, number=1).attempts == 1


def test_a_backoff_after_an_error_is_another_attempt():
    run = drive(
        make_run(script(calls({"tool": "flaky", "args": {"failures": 1}}), final())),
        through_backoff=True,
    )
    assert run.status == "succeeded"
    step = Step.objects.get(run=run, number=1)
    assert step.attempts == 2 and len(step.tool_calls.get().attempts) == 2
    assert [r.retried for r in timeline.rows(run)] == [True, False]
