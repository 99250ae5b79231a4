"""An operator's "retry" of a call left in doubt covers one attempt only."""

import os

import pytest

from agentrun import engine
from agentrun.lifecycle import services
from agentrun.models import OutboxMessage, Run
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = [pytest.mark.django_db, pytest.mark.durability]


class Crash(BaseException):
    """Stands in for the worker process dying."""


def lose_the_lease(run):
    Run.objects.filter(pk=run.pk).update(lease_expires_at=None)  # the dead worker's lease ran out


def test_a_retried_call_that_is_left_in_doubt_again_waits_for_the_operator_again(monkeypatch):
    olga = make_people()["operator"]
    run = make_run(
        script(
            calls({"tool": "notify", "args": {"to": "ops", "body": "hi"}, "fault": "crash_after"}),
            final(),
        )
    )
    monkeypatch.setattr(os, "_exit", lambda code: (_ for _ in ()).throw(Crash(code)))
    with pytest.raises(Crash):
        engine.execute_step(run.pk, 1)
    lose_the_lease(run)
    drive(run)
    assert (run.status, run.wait_reason) == ("waiting", "in_doubt")

    services.decide_approval(run, user=olga, decision="approve", resolution="retry")
    real_save = engine.act._save_side_effect_result

    def die_after_sending(ctx, tc, t):
        monkeypatch.setattr(engine.act, "_save_side_effect_result", real_save)
        raise Crash("after the retry sent")

    monkeypatch.setattr(engine.act, "_save_side_effect_result", die_after_sending)
    with pytest.raises(Crash):
        engine.execute_step(run.pk, 1)
    lose_the_lease(run)
    drive(run)
    assert (run.status, run.wait_reason) == ("waiting", "in_doubt")
    assert (
        OutboxMessage.objects.filter(run=run).count() == 2
    )  # sent twice, never a third time silently
