"""A worker paused with fifty steps in flight is a zombie: none of its late commits land.

Each run pays once (step 1), then waits: half the runs on a slow model (step 2's
decision), the other half on a slow tool (step 2's `sleep`, decided quickly).
The worker is SIGSTOPped with every run waiting, a healthy worker takes the
runs over once their leases expire and finishes them, then the zombie is woken:
each of its steps finds its lease gone and writes nothing. The takeover reused
every decision on record (only the decisions the zombie never got were asked
for again) and no payment was made twice.
"""

import signal
import time

import pytest
from django.conf import settings

from agentrun.models import Event, LedgerEntry, LedgerInvocation, Run, Snapshot, Step, ToolCall
from tests.agentrun.llm_load import (
    all_finished,
    decision_counts,
    explain,
    goal,
    goal_of,
    llm_env,
    on_postgres,
    requests_per_turn,
    start_runs,
    statuses,
    turn_of,
)
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, tool_call
from tests.workers import PAUSED_ON_RABBITMQ, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.durability,
    pytest.mark.skipif(bool(PAUSED_ON_RABBITMQ), reason=PAUSED_ON_RABBITMQ),
]

# An embedded worker runs 8 steps at a time (SQLite has one writer): all 8 in flight.
RUNS = 50 if on_postgres() else settings.AGENTRUN_WORKER_CONCURRENCY
WAIT = 5.0  # how long step 2 waits, on the model or on the tool
SLOW_MODEL = [goal(i) for i in range(0, RUNS, 2)]
SLOW_TOOL = [goal(i) for i in range(1, RUNS, 2)]


def model(request: Recorded) -> Reply:
    """Pay; then (slowly for half the runs) sleep a while (slowly for the others); answer."""
    turn, conversation = turn_of(request), goal_of(request)
    if turn == 0:
        pay = {"account": conversation.split(":")[0], "amount": 10}
        return Reply(200, completion(tool_calls=[tool_call("ledger_write", pay, id="call_pay")]))
    if turn == 1:
        slow_tool = conversation in SLOW_TOOL
        sleep = tool_call("sleep", {"seconds": WAIT if slow_tool else 0}, id="call_sleep")
        return Reply(200, completion(tool_calls=[sleep]), delay=0 if slow_tool else WAIT)
    return Reply(200, completion("paid and waited"))


def everything_about(runs: list[Run]) -> dict:
    """What the runs have on record, to compare before and after the zombie wakes up."""
    steps = Step.objects.filter(run__in=runs)
    return {
        "snapshots": sorted(Snapshot.objects.filter(run__in=runs).values_list("pk", "hash")),
        "events": sorted(Event.objects.filter(run__in=runs).values_list("pk", flat=True)),
        "calls": sorted(ToolCall.objects.filter(run__in=runs).values_list("pk", "status")),
        "steps": sorted(steps.values_list("pk", "attempts", "decision_count", "finished_at")),
        "ledger": LedgerEntry.objects.filter(run__in=runs).count(),
        "runs": sorted(
            Run.objects.filter(pk__in=[r.pk for r in runs]).values_list(
                "pk", "status", "next_step", "updated_at"
            )
        ),
    }


def test_a_zombie_with_fifty_steps_in_flight_commits_none_of_them(start_worker):
    with FakeOpenAI(respond=model) as fake:
        # The worker first: it may take the messages before it says it is ready (RabbitMQ
        # hands them over at once), and the runs must still be on step 2 here.
        zombie = start_worker(**llm_env(fake))
        runs = start_runs(RUNS, tools=["ledger_write", "sleep"])
        ids = [r.pk for r in runs]

        def all_waiting() -> bool:
            """Every run on step 2: half waiting on the model, the other half in the tool."""
            asked = requests_per_turn(fake)
            decided = Step.objects.filter(run__in=runs, number=2, decision__isnull=False)
            return (
                Run.objects.filter(pk__in=ids, next_step=2, lease_owner__gt="").count() == RUNS
                and decided.count() == len(SLOW_TOOL)
                and all(asked[(g, 1)] for g in SLOW_MODEL)
            )

        wait_until(all_waiting, timeout=60, interval=0.05, what="every run waiting on step 2")
        zombie.signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        held = dict(Run.objects.filter(pk__in=ids).values_list("pk", "lease_owner"))
        assert all(held.values()), "the zombie should hold every run's lease"

        # Past the leases, a healthy worker's reconciler takes the runs over.
        healthy = start_worker(beat=True, **llm_env(fake))
        try:
            wait_until(all_finished(runs), timeout=90, interval=0.5, what="every run to finish")
        except TimeoutError:
            print(explain(runs, healthy))
            raise
        assert statuses(runs) == {"succeeded": RUNS}, explain(runs, healthy)
        on_record = everything_about(runs)

        # Woken up, each of the zombie's fifty steps finds its lease gone.
        zombie.signal(signal.SIGCONT)
        wait_until(
            lambda: zombie.text().count(": lease lost (") >= RUNS,
            timeout=30,
            what=f"the zombie to lose {RUNS} leases",
        )
        time.sleep(1.0)  # anything it would still write
        assert zombie.text().count(": lease lost (") == RUNS
        assert everything_about(runs) == on_record

    # One post snapshot per step; step 2 claimed twice (the zombie, the takeover).
    posts = Snapshot.objects.filter(run__in=runs, at="post")
    assert posts.count() == posts.values("run", "step").distinct().count() == 3 * RUNS
    second_steps = Step.objects.filter(run__in=runs, number=2)
    assert set(second_steps.values_list("attempts", flat=True)) == {2}
    assert decision_counts(runs) == {1: 3 * RUNS}
    # The takeover reused the decisions on record: the model was asked again only for
    # the step-2 decisions the zombie was still waiting for.
    assert requests_per_turn(fake, until=stopped_at) == {
        (g, turn): 1 for g in SLOW_TOOL + SLOW_MODEL for turn in (0, 1)
    }
    assert requests_per_turn(fake, since=stopped_at) == (
        {(g, 2): 1 for g in SLOW_TOOL} | {(g, turn): 1 for g in SLOW_MODEL for turn in (1, 2)}
    )
    # Step 1's payment was committed before the pause: made once, never again.
    assert LedgerEntry.objects.filter(run__in=runs).count() == RUNS
    assert set(LedgerInvocation.objects.filter(run__in=runs).values_list("count", flat=True)) == {1}
