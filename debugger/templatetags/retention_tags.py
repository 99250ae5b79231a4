"""The run page's retention block (pin / unpin, when the run is purged)."""

from __future__ import annotations

from typing import Any

from django import template

from agentrun.lifecycle import retention
from agentrun.models import Run

register = template.Library()


@register.inclusion_tag("debugger/_retention.html", takes_context=True)
def retention_block(context: Any, run: Run) -> dict[str, Any]:
    period = retention.retention()
    kept_by = None
    if run.pinned_at is None and run.purged_at is None:
        kept_by = retention.kept_by(run)
    return {
        "run": run,
        "can_operate": context.get("can_operate", False),
        "csrf_token": context.get("csrf_token"),
        "purge_after": retention.purge_after(run),
        "kept_by": kept_by,
        "retention_days": settings_days(period),
    }


def settings_days(period: Any) -> str:
    if period is None:
        return ""
    days = period.total_seconds() / 86400
    return f"{days:g}"
