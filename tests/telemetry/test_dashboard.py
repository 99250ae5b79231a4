"""The Grafana dashboard of the docs queries only metrics agentrun serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from agentrun.telemetry import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs/operations/agentrun-grafana.json"


def served() -> set[str]:
    """Every sample name the web's and the workers' metrics can have."""
    families = [*metrics.WEB_REGISTRY.collect()]
    for collector in (metrics.STEP_ATTEMPTS, metrics.STEP_DURATION, metrics.LLM_DURATION,
                      metrics.TOOL_CALLS, metrics.RECONCILER):  # fmt: skip
        families += collector.describe()
    suffixes = ("", "_total", "_bucket", "_sum", "_count")
    return {f.name + s for f in families for s in suffixes}


def test_every_query_of_the_dashboard_names_a_served_metric(db):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 12
    named = {m for e in exprs for m in re.findall(r"\bagentrun_[a-z_]+", e)}
    assert "agentrun_runs_ended_total" in named
    assert named <= served(), named - served()
