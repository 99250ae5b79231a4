"""Watching one value of a run's state: the steps that changed it, found from the deltas."""

from __future__ import annotations

import json

import pytest

from agentrun import services, snapshots, watch
from agentrun.builtin.shop import STAGE_STEPS
from agentrun.models import Snapshot
from agentrun.watch import MISSING, PathSyntaxError, parse_path
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

RECOMMEND = STAGE_STEPS["recommend"]
INCIDENT = {
    "goal": "Get me ready for a weekend camping trip",
    "user": "ben",
    "cart": [{"sku": "STOVE-1", "qty": 1}, {"sku": "TENT-2P", "qty": 1}],
    "cart_changes": [{"after_step": 2, "remove": "STOVE-1"}],
    "approval": False,
}


@pytest.fixture
def incident():
    run = drive(services.start_run("shop", INCIDENT), through_backoff=True)
    assert run.status == "succeeded", run.error
    return run


def skus(note: str) -> list[str]:
    return [line["sku"] for line in json.loads(note)]


def test_the_stale_cart_note_was_written_once_at_step_2_and_never_again(incident):
    h = watch.history(incident, parse_path("memory.notes.cart"))

    assert [(c.step, c.at, c.kind) for c in h.changes] == [(2, "post", "added")]
    (change,) = h.changes
    assert change.before is MISSING
    assert skus(change.after) == ["STOVE-1", "TENT-2P"]
    assert not h.start.exists and h.ever_existed and h.exists_now
    assert skus(h.current) == ["STOVE-1", "TENT-2P"]  # the stove the user removed, still
    # Only the snapshots that may have touched the notes were read, not every delta.
    deltas = Snapshot.objects.filter(run=incident).exclude(kind="ref").count()
    assert h.snapshots_read < deltas
