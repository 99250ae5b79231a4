"""A step whose tool outlasts the lease keeps it: nobody else takes the step over."""

import pytest

from agentrun.models import Snapshot, Step
from tests.base import calls, final, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]


def test_a_long_tool_call_extends_the_lease_instead_of_losing_the_step(start_worker):
    run = make_run(script(calls({"tool": "sleep", "args": {"seconds": 8}}), final("rested")))
    start_worker(beat=True, concurrency=2)  # a free process and the reconciler stand ready
    wait_until(
        lambda: run.refresh_from_db() or run.status in ("succeeded", "failed"),
        timeout=60,
        what="the run to finish",
    )
    assert run.status == "succeeded"
    assert Step.objects.get(run=run, number=1).attempts == 1  # 8 s > the 3 s lease, yet one attempt
    assert Step.objects.get(run=run, number=1).status == "succeeded"
    assert Snapshot.objects.filter(run=run, step=1, at="post").count() == 1
