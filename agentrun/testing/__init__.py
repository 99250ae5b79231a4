"""Incidents as regression tests: replay exported runs on the current code and check the verdict.

A developer keeps an incident's archive (`manage.py exportrun`) in their repository;
`replay_archive` imports it into the database at hand (a test's), forks each run in sandbox
mode from its fork point (before its failure, by default), executes the fork in this process
on the current code, and gives the verdict against the run as it was recorded ("fixed",
"still_failing", ...). `assert_replays` fails a test when a verdict is not the expected one;
`manage.py replaytest ARCHIVE...` does the same in a throwaway database, for CI.

    from agentrun.testing import assert_replays

    def test_the_stale_cart_incident_stays_fixed(db):
        assert_replays(["incidents/stale-cart.agentrun.jsonl.gz"], expect="fixed")
"""

from agentrun.testing.replays import Replayed, assert_replays, replay_archive

__all__ = ["Replayed", "assert_replays", "replay_archive"]
