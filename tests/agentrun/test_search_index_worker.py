"""A worker builds the stored search index of a long run when the run ends
(agentrun.store.callsearch), and the search uses it."""

from __future__ import annotations

import pytest

from agentrun.models import SearchBlock, Step
from agentrun.store import callsearch, search
from agentrun.store.search import matching_steps
from tests.base import calls, final, make_people, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_worker_builds_the_index_of_a_long_run_when_it_ends(start_worker, settings):
    settings.AGENTRUN_SEARCH_INDEX_STEPS = 10
    search.forget_call_texts()
    n = 12
    run = make_run(
        script(*[calls({"tool": "echo", "args": {"n": f"needle-{i}"}}) for i in range(n)], final()),
        user=make_people()["operator"],
    )
    start_worker(AGENTRUN_SEARCH_INDEX_STEPS="10")

    def indexed() -> bool:
        # Blocks show up while the build writes them, under a version of their own.
        run.refresh_from_db()
        return callsearch.has_index(run)

    wait_until(indexed, timeout=60, what="the index")

    assert run.status == "succeeded"
    step_7 = Step.objects.get(run=run, number=8).pk
    version = callsearch.calls_version(run)
    assert callsearch.indexed_steps_with(version, "needle-7") == {step_7}
    assert matching_steps(run, q="NEEDLE-7") == {8}
    assert not SearchBlock.objects.filter(run=run, version__startswith="building").exists()
