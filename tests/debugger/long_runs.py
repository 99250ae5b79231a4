"""Long runs for the run page's scale tests, written straight into the tables.

The engine would take minutes for thousands of steps; these rows have what the
run page reads (steps, tool calls, wait events, results compressed as stored), and
no snapshots (the page loads a step's snapshots on demand).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentrun.models import Event, Run, Step, ToolCall

PHASES = ("planning", "executing", "reflecting")


def long_run(
    user: Any,
    steps: int,
    *,
    failed: int | None = None,
    retried: tuple[int, ...] = (),
    backoff: dict[int, float] | None = None,
    status: str = "succeeded",
    thought: Any = None,
    with_snapshots: bool = False,
) -> Run:
    """A finished run of `steps` steps: each reads with `lookup`, every 10th also writes
    with `ledger_write`, the last answers. `failed`: that step failed (and the run ends
    there); `retried`: steps claimed twice; `backoff`: step → seconds of backoff before
    its second attempt (a retry_scheduled event, and wall time to match).
    `with_snapshots`: a small state's pre and post snapshots too (for a browser, whose
    step body loads them)."""
    backoff = backoff or {}
    now = timezone.now() - timedelta(hours=1)
    last = failed or steps
    run = Run.objects.create(
        agent="scripted",
        agent_version="long",
        input={"goal": f"{steps}-step run"},
        status="failed" if failed else status,
        phase="error" if failed else "done",
        created_by=user,
        next_step=last + 1,
        started_at=now,
        finished_at=now + timedelta(seconds=last),
    )
    rows, calls, events = [], [], []
    for k in range(1, last + 1):
        start = now + timedelta(seconds=k)
        wait = backoff.get(k, 0.0)
        answer = k == last and not failed
        rows.append(
            Step(
                run=run,
                number=k,
                status="failed" if k == failed else "succeeded",
                attempts=2 if (k in retried or k in backoff) else 1,
                phase_before=PHASES[(k - 1) % 3],
                phase_after="error" if k == failed else ("done" if answer else PHASES[k % 3]),
                decision={
                    "thought": thought(k) if thought else f"Thought number {k}",
                    "rationale": f"because of reason {k}",
                    "calls": [],
                    "final": "all done" if answer else None,
                },
                duration_ms=3.0 + k % 7,
                state_size=1000 + 10 * k,
                started_at=start,
                finished_at=start + timedelta(milliseconds=3.0 + k % 7, seconds=wait),
            )
        )
        if wait:
            events.append(
                Event(
                    run=run,
                    step=k,
                    kind="retry_scheduled",
                    actor="system",
                    payload={"backoff_s": wait, "error": "RateLimited: slow down"},
                    created_at=start,
                )
            )
    with transaction.atomic():
        Step.objects.bulk_create(rows, batch_size=500)
        Event.objects.bulk_create(events)
        ids = dict(Step.objects.filter(run=run).values_list("number", "pk"))
        for k in range(1, last + 1):
            if k == last and not failed:
                continue
            specs = [("lookup", "read", {"item": f"item-{k}"}, {"found": f"value-{k}"})]
            if k % 10 == 0:
                specs.append(("ledger_write", "write", {"account": "acct", "amount": k}, {"ok": k}))
            for i, (tool, kind, args, result) in enumerate(specs):
                calls.append(
                    ToolCall(
                        run=run,
                        step_id=ids[k],
                        index=i,
                        tool=tool,
                        kind=kind,
                        args=args,
                        args_hash=f"{k:08x}{i:08x}",
                        idempotency_key=f"{run.pk}:{k}:{i}:{tool}",
                        status="failed" if k == failed else "ok",
                        result=None if k == failed else result,
                        attempts=[{"duration_ms": 1.0, "error": None}],
                    )
                )
        ToolCall.objects.bulk_create(calls, batch_size=500)
        if with_snapshots:
            _snapshots(run, last)
    return run


def _snapshots(run: Run, last: int) -> None:
    from agentrun.models import Snapshot
    from agentrun.store import snapshots

    state: dict[str, Any] = {"phase": "planning", "memory": {"notes": []}, "iteration": 0}
    prev, node, batch = None, None, []
    for k in range(1, last + 1):
        if prev is None:
            pre, node = snapshots.build(run.pk, k, "pre", state, None, None)
        else:
            pre = snapshots.reference(run.pk, k, "pre", prev)
        new = {
            "phase": PHASES[k % 3],
            "memory": {"notes": [*state["memory"]["notes"][-4:], f"note {k}"]},
            "iteration": k,
        }
        post, node = snapshots.build(run.pk, k, "post", new, pre, state, prev_node=node)
        batch += [pre, post]
        prev, state = post, new
    Snapshot.objects.bulk_create(batch, batch_size=500)
