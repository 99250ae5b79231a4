"""A worker regroups a long run's deltas when the run ends (agentrun.store.compaction), and every
snapshot still reads as the state its hash says."""

from __future__ import annotations

import pytest
from django.db.models import BinaryField, ExpressionWrapper, F

from agentrun.models import Snapshot
from agentrun.store import codec, hashing, snapshots
from agentrun.store.codec import GROUP, SLICE
from tests.base import calls, final, make_people, make_run, script
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

RAW = ExpressionWrapper(F("data"), output_field=BinaryField())


def test_a_worker_regroups_a_long_runs_deltas_when_it_ends(start_worker):
    n = 30
    run = make_run(
        script(*[calls({"tool": "echo", "args": {"n": f"item-{i}"}}) for i in range(n)], final()),
        user=make_people()["operator"],
    )
    start_worker(AGENTRUN_COMPACT_STEPS="10")

    def regrouped() -> bool:
        """Every delta in a group but those alone between two keyframes."""
        rows = Snapshot.objects.filter(run=run).exclude(kind="ref").order_by("seq")
        heads = [(kind, bytes(d[:1])) for kind, d in rows.values_list("kind", RAW)]
        alone = [
            i
            for i, (kind, head) in enumerate(heads)
            if kind == "delta"
            and head not in (GROUP, SLICE)
            and all(k != "delta" for k, _ in heads[max(i - 1, 0) : i] + heads[i + 1 : i + 2])
        ]
        loose = sum(1 for kind, head in heads if kind == "delta" and head not in (GROUP, SLICE))
        return len(heads) >= n + 2 and heads[-1][0] != "ref" and loose == len(alone) < n / 3

    wait_until(regrouped, timeout=60, what="the deltas regrouped")

    run.refresh_from_db()
    assert run.status == "succeeded"
    codec.forget_groups()
    codec.forget_dictionaries()
    snapshots.forget_keyframe_texts()
    read = snapshots.history(run.pk)
    assert len(read) == 2 * (n + 1)
    for snap, state in read:
        assert hashing.build(state).hex == snap.hash, (snap.step, snap.at)
