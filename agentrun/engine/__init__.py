"""Executing the steps of a run (DESIGN section 4), one module per phase.

`execute_step(run_id, n)` is what the Celery task calls. Read it top to bottom:

- `step`       execute_step: claim, then decide → act → commit, chaining steps for a while;
- `claim`      phase 1: take the lease on (run, step) and make sure the pre snapshot exists;
- `decide`     phase 2: ask the agent's policy once, store the decision before any tool runs
               (a retried step reuses it, so a model is never asked twice);
- `act`        phase 3: each tool call with its intent → attempts → result on record;
               `invoke` calls a tool within its timeout, `replay` serves forks;
- `commit`     phase 4: post snapshot and next step in one compare-and-set write;
- `waits`      a backoff (wake-up time in the database) or a wait for an operator;
- `compensate` on cancel or terminal failure, undo successful hybrid calls, newest first.

Shared by all of them: `context` (the step's context and outcome), `lease` (guarded
writes and the one watchdog per process that renews the leases of waiting steps),
and `cache` (the latest state of each run this process works on); wake-ups go through
`agentrun.infra.queue`.
No transaction is held open across a policy or tool call, and no database
connection either: a waiting step hands it back to its process's pool
(`release_connection`).
"""

from agentrun.engine.cache import remember_state
from agentrun.engine.claim import claim
from agentrun.engine.compensate import compensate_run
from agentrun.engine.context import LeaseLost, Outcome, release_connection, sorted_keys
from agentrun.engine.decide import idempotency_key
from agentrun.engine.lease import new_lease_owner
from agentrun.engine.step import execute_step
from agentrun.infra.queue import enqueue

__all__ = [
    "LeaseLost",
    "Outcome",
    "claim",
    "compensate_run",
    "enqueue",
    "execute_step",
    "idempotency_key",
    "new_lease_owner",
    "release_connection",
    "remember_state",
    "sorted_keys",
]
