"""An incident's archive, kept in the repository, replayed by the test suite on every change."""

from agentrun.testing import assert_replays

INCIDENTS = ["tests/fleet/empty-order.agentrun.jsonl.gz"]


def test_the_empty_order_incident_stays_fixed(db):
    assert_replays(INCIDENTS, expect="fixed")
