"""Phase 5 (on cancel or failure): undo a run's successful hybrid calls."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agentrun.audit.events import record_event
from agentrun.models import (
    Run,
    ToolCall,
    ToolCallStatus,
)
from agentrun.security.storable import escape_redacted, escape_text
from agentrun.tools import ToolContext, get_tool


def compensate_run(run: Run) -> int:
    """Undo the run's successful hybrid calls, newest first. Idempotent; returns how many."""
    done = 0
    pending = ToolCall.objects.filter(run=run, kind="hybrid", status=ToolCallStatus.OK).order_by(
        "-step__number", "-index"
    )
    for tc in pending:
        t = get_tool(tc.tool)
        key = f"{tc.idempotency_key}:compensate"
        tctx = ToolContext(str(run.pk), tc.step.number, tc.index, key)
        try:
            outcome = t.compensate(tctx, tc.args, tc.result) if t.compensate else None
            tc.compensation = {
                "status": "ok",
                "at": timezone.now().isoformat(),
                "key": key,
                "result": escape_redacted(outcome),
            }
            tc.status = ToolCallStatus.COMPENSATED
            done += 1
        except Exception as exc:  # recorded; the reconciler tries again
            tc.compensation = {
                "status": "failed",
                "at": timezone.now().isoformat(),
                "key": key,
                "error": escape_text(f"{type(exc).__name__}: {exc}"),
            }
        with transaction.atomic():
            tc.save(update_fields=["status", "compensation"])
            record_event(
                "compensated" if tc.status == ToolCallStatus.COMPENSATED else "compensation_failed",
                run=run,
                step=tc.step.number,
                payload={"tool": tc.tool, "key": tc.idempotency_key, **tc.compensation},
            )
    return done
