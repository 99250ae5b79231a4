"""Search reads a run's tool calls (arguments, results) once per process, and a live
run's new steps too."""

from __future__ import annotations

import pytest

from agentrun.models import Step, ToolCall
from agentrun.store import callsearch, search
from agentrun.store.search import matching_steps
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def reads(monkeypatch):
    """The `from_step_id` of every read of stored calls, in order."""
    search.forget_call_texts()
    seen: list[int] = []
    real = search.stored_calls

    def counting(run_id, from_step_id=0):
        seen.append(from_step_id)
        return real(run_id, from_step_id)

    monkeypatch.setattr(search, "stored_calls", counting)
    yield seen
    search.forget_call_texts()


def add_steps(run, numbers):
    """Steps committed after the run was first searched: a lookup each, as long_run's."""
    for k in numbers:
        step = Step.objects.create(
            run=run,
            number=k,
            status="succeeded",
            decision={"thought": f"Thought number {k}", "calls": [], "final": None},
        )
        ToolCall.objects.create(
            run=run,
            step=step,
            index=0,
            tool="lookup",
            kind="read",
            args={"item": f"item-{k}"},
            args_hash=f"{k:064x}",
            idempotency_key=f"{run.pk}:{k}:0:lookup",
            status="ok",
            result={"found": f"value-{k}"},
        )
    run.next_step = max(numbers) + 1
    run.save(update_fields=["next_step"])


def test_a_finished_runs_results_are_read_once_and_searched_again_from_memory(people, reads):
    run = long_run(people["operator"], 60)

    assert matching_steps(run, q="VALUE-33") == {33}
    assert matching_steps(run, q="value-4") == {4, *range(40, 50)}
    assert matching_steps(run, q='"found": "value-5"') == set()  # stored compactly
    assert matching_steps(run, q='"found":"value-5"') == {5}
    assert matching_steps(run, q="value-5", tool="ledger_write") == {50}
    assert matching_steps(run, q="ITEM-12") == {12}  # arguments
    assert matching_steps(run, q="no such text") == set()
    assert reads == [0]


def test_text_outside_ascii_is_found_in_any_case(people, reads):
    run = long_run(people["operator"], 5)
    ToolCall.objects.filter(run=run, step__number=3).update(result={"found": "Ärger im Café"})
    ToolCall.objects.filter(run=run, step__number=2).update(args={"item": "ÉTÉ"})
    assert matching_steps(run, q="ärger IM café") == {3}
    assert matching_steps(run, q="été") == {2}


def test_a_live_runs_new_steps_are_found_after_it_was_searched(people, reads):
    run = long_run(people["operator"], 30, status="running")
    assert matching_steps(run, q="value-35") == set()
    assert matching_steps(run, q="value-2") == {2, *range(20, 30)}

    add_steps(run, range(31, 41))
    run.refresh_from_db()

    assert matching_steps(run, q="value-35") == {35}
    assert matching_steps(run, q="value-2") == {2, *range(20, 30)}
    # Only the last step read before and the new ones were read again.
    last_read = Step.objects.get(run=run, number=29).pk
    assert reads == [0, last_read]


def test_a_run_whose_calls_changed_otherwise_is_read_again_whole(people, reads):
    run = long_run(people["operator"], 30)
    assert matching_steps(run, q="value-7") == {7}
    ToolCall.objects.filter(run=run, step__number=7).delete()
    assert matching_steps(run, q="value-7") == set()
    assert reads == [0, 0]


def test_without_room_in_the_cache_every_search_reads_the_results(people, reads, settings):
    settings.AGENTRUN_SEARCH_CACHE_MB = 0
    run = long_run(people["operator"], 20)
    assert matching_steps(run, q="value-12") == {12}
    assert matching_steps(run, q="value-12") == {12}
    assert reads == [0, 0]


def test_text_no_result_can_hold_matches_nothing_not_even_across_two_results(people, reads):
    run = long_run(people["operator"], 20)
    text = search.call_text(run)
    assert text.steps_with("value-1") == set(
        Step.objects.filter(run=run, number__in=[1, *range(10, 20)]).values_list("pk", flat=True)
    )
    sep = callsearch.CALL_SEP
    assert text.steps_with("\x00") == set() == text.steps_with(f'-1"}}{sep}{{"found')
    assert text.steps_with('-1"}{"found') == set()
