"""One call of the worker task: claim, decide, act, commit (and chain)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from agentrun.agents import CallResult
from agentrun.engine.act import act_on_call
from agentrun.engine.claim import UnknownAgent, claim
from agentrun.engine.commit import commit_step
from agentrun.engine.context import Claimed, LeaseLost, Outcome
from agentrun.engine.decide import calls_of, decide_step
from agentrun.engine.lease import new_lease_owner
from agentrun.engine.waits import note_crash, park_crashed, park_unknown_agent
from agentrun.telemetry import step_crashed, step_ended

log = logging.getLogger(__name__)


def execute_step(
    run_id: Any,
    number: int,
    owner: str | None = None,
    *,
    chain: float = 0.0,
    observe: Callable[[Outcome], None] | None = None,
) -> Outcome:
    """Run step `number` of a run, if it is due and nobody else holds it.

    With `chain` seconds, a step that commits within that time from the start
    also claims the next step in the same statement and this call goes on with
    it: no broker round trip and no separate claim between the steps of a
    run. Each step is still claimed, decided and committed as one (a crash
    mid-chain loses only the lease, which expires). Returns the last step's
    outcome; `observe` sees each one as it commits.
    """
    owner = owner or new_lease_owner()
    try:
        ctx = claim(str(run_id), number, owner)
    except UnknownAgent as exc:
        return park_unknown_agent(exc.run, exc.number, exc.owner, str(exc))
    if ctx is None:
        return Outcome("not_claimed", str(run_id), number)
    ctx.chain_until = time.monotonic() + chain if chain > 0 else 0.0
    while True:
        try:
            if ctx.step.crashes >= settings.AGENTRUN_MAX_STEP_ATTEMPTS:
                outcome = park_crashed(ctx)
            else:
                outcome = _run_claimed(ctx)
        except LeaseLost as exc:
            log.warning("step %s of %s: lease lost (%s)", ctx.step.number, run_id, exc)
            step_ended(ctx, "lost", str(exc))
            return Outcome("lost", str(run_id), ctx.step.number, str(exc))
        except Exception as exc:
            note_crash(ctx, exc)
            step_crashed(ctx, exc)
            raise
        step_ended(ctx, outcome.status, outcome.detail)
        if observe is not None:
            observe(outcome)
        if ctx.next is None:
            return outcome
        ctx = ctx.next


def _run_claimed(ctx: Claimed) -> Outcome:
    decision = decide_step(ctx)
    if isinstance(decision, Outcome):
        return decision
    calls = calls_of(ctx, decision)
    ctx.decision = decision
    ctx.acted = [
        (tc, call.call_id, len(tc.attempts)) for call, tc in zip(decision.calls, calls, strict=True)
    ]
    results: list[CallResult] = []
    for call, tc in zip(decision.calls, calls, strict=True):
        outcome = act_on_call(ctx, call, tc)
        if isinstance(outcome, Outcome):
            return outcome
        results.append(outcome)
    return commit_step(ctx, decision, results)
