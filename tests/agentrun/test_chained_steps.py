"""A commit that claims the next step: the in-process executor and Celery's chained tasks."""

import time

import pytest

from agentrun import engine
from agentrun.lifecycle import services
from agentrun.models import Event, Run, Snapshot, Step, ToolCall
from agentrun.store import snapshots
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = [pytest.mark.django_db, pytest.mark.durability]

ECHOES = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls({"tool": "echo", "args": {"n": 2}}),
    calls({"tool": "echo", "args": {"n": 3}}),
    final("three echoes"),
)


def test_a_chained_call_runs_the_whole_run_with_every_record_a_step_by_step_run_has():
    chained, stepped = make_run(ECHOES), make_run(ECHOES)
    seen = []
    out = engine.execute_step(chained.pk, 1, chain=60, observe=lambda o: seen.append(o.status))
    drive(stepped)
    chained.refresh_from_db()
    assert out.status == "finished" and seen == ["committed"] * 3 + ["finished"]
    assert chained.status == stepped.status == "succeeded"
    assert chained.lease_owner == "" and chained.lease_expires_at is None
    for n in range(1, 5):
        a, b = Step.objects.get(run=chained, number=n), Step.objects.get(run=stepped, number=n)
        assert (a.status, a.attempts, a.phase_before, a.phase_after, a.decision) == (
            b.status,
            b.attempts,
            b.phase_before,
            b.phase_after,
            b.decision,
        )
        for at in ("pre", "post"):
            assert snapshots.load(chained.pk, n, at) == snapshots.load(stepped.pk, n, at)
    kinds = list(Event.objects.filter(run=chained).order_by("id").values_list("kind", flat=True))
    assert kinds == list(
        Event.objects.filter(run=stepped).order_by("id").values_list("kind", flat=True)
    )
    assert [tc.result for tc in ToolCall.objects.filter(run=chained).order_by("step__number")] == [
        tc.result for tc in ToolCall.objects.filter(run=stepped).order_by("step__number")
    ]


def test_a_commit_holds_the_lease_for_the_next_step_only_while_the_chain_has_time():
    run = make_run(ECHOES)
    out = engine.execute_step(run.pk, 1, chain=0)  # no chain: one step, lease released
    run.refresh_from_db()
    assert out.status == "committed" and run.next_step == 2 and run.lease_owner == ""
    assert not Step.objects.filter(run=run, number=2).exists()

    stop = {}

    def observe(outcome: engine.Outcome) -> None:
        if outcome.step == 2:
            stop["at"] = time.monotonic()
            time.sleep(0.3)  # step 3 starts after the chain's time is up

    out = engine.execute_step(run.pk, 2, chain=0.2, observe=observe)
    run.refresh_from_db()
    # Step 2 committed within the chain's time and claimed step 3; step 3 ran and,
    # committing after the deadline, released the lease and stopped the chain.
    assert out.status == "committed" and out.step == 3
    assert run.next_step == 4 and run.lease_owner == "" and run.status == "running"
    assert Step.objects.get(run=run, number=3).attempts == 1
    assert not Step.objects.filter(run=run, number=4).exists()


def test_a_cancel_between_chained_steps_stops_the_chain_and_writes_nothing_more():
    run = make_run(ECHOES)
    olga = make_people()["operator"]

    def observe(outcome: engine.Outcome) -> None:
        if outcome.step == 1:
            services.cancel_run(Run.objects.get(pk=run.pk), user=olga, reason="stop")

    out = engine.execute_step(run.pk, 1, chain=60, observe=observe)
    run.refresh_from_db()
    assert out.status == "lost" and out.step == 2
    assert run.status == "cancelled" and run.next_step == 2
    assert Step.objects.get(run=run, number=2).status == "cancelled"
    assert Step.objects.get(run=run, number=2).decision is None
    assert not Snapshot.objects.filter(run=run, step=2, at="post").exists()
    assert not ToolCall.objects.filter(run=run, step__number=2).exists()


def test_a_chain_claims_nothing_past_a_final_step_or_a_failure():
    run = make_run(script(calls({"tool": "fail", "args": {"message": "boom"}}), final("never")))
    out = engine.execute_step(run.pk, 1, chain=60)
    run.refresh_from_db()
    assert out.status == "failed" and run.status == "failed" and run.lease_owner == ""
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == [1]
