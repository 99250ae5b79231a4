"""One worker process keeps many LLM-bound runs in flight at once.

Every step waits ~0.5-1 s on a slow model: one step at a time, 200 runs of three
steps would take minutes; with the threads pool they overlap, and the fake
provider sees many requests at once. Each decision is asked for exactly once.
"""

import pytest
from django.conf import settings

from agentrun.models import Run, Step, ToolCall
from tests.agentrun.llm_load import (
    all_finished,
    decision_counts,
    explain,
    goal,
    llm_env,
    on_postgres,
    requests_per_turn,
    spread,
    start_runs,
    statuses,
    turn_of,
)
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, tool_call
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]

# SQLite has one writer, so an embedded worker runs 8 steps at a time
# (AGENTRUN_WORKER_CONCURRENCY): 200 runs of three ~0.75 s steps would take over a
# minute there. 40 runs still keep every one of its threads waiting on the model.
RUNS = 200 if on_postgres() else 40
EXPECTED_PEAK = 50 if on_postgres() else 6


def slow_model(request: Recorded) -> Reply:
    """Echo twice, then answer; each reply after 0.5-1 s."""
    turn = turn_of(request)
    if turn < 2:
        body = completion(tool_calls=[tool_call("echo", {"turn": turn}, id=f"call_{turn}")])
    else:
        body = completion("echoed twice")
    return Reply(200, body, delay=spread(request, 0.5, 1.0))


def test_two_hundred_llm_runs_finish_concurrently_in_one_worker(start_worker):
    with FakeOpenAI(respond=slow_model) as fake:
        runs = start_runs(RUNS, tools=["echo"])
        worker = start_worker(**llm_env(fake))
        try:
            wait_until(all_finished(runs), timeout=150, interval=0.5, what="every run to finish")
        except TimeoutError:
            print(explain(runs, worker))
            raise

        assert statuses(runs) == {"succeeded": RUNS}, explain(runs, worker)
        answers = Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("final_answer")
        assert set(answers) == {("echoed twice",)}
        # Many steps waited on the model at the same time, never more than the
        # worker runs at once.
        assert fake.peak_in_flight >= EXPECTED_PEAK, fake.peak_in_flight
        assert fake.peak_in_flight <= settings.AGENTRUN_WORKER_CONCURRENCY
        # Each decision was asked for once: three requests per run, one per turn.
        asked = requests_per_turn(fake)
        assert asked == {(goal(i), turn): 1 for i in range(RUNS) for turn in range(3)}
        assert decision_counts(runs) == {1: 3 * RUNS}
        assert Step.objects.filter(run__in=runs, status="succeeded").count() == 3 * RUNS
        echoes = ToolCall.objects.filter(run__in=runs, tool="echo")
        assert echoes.filter(status="ok").count() == echoes.count() == 2 * RUNS
