"""An incident of the `refunds` agent and its fix, in one process: runs on v1 that fail,
then "v2" deployed here (the fixed policy, the version this process says it runs)."""

from __future__ import annotations

from agentrun.agents import get_agent
from agentrun.engine import versions
from agentrun.lifecycle import batches, services
from agentrun.models import Run
from tests.base import drive
from tests.fleet import refunds_v1  # noqa: F401  (registers the agent, buggy)
from tests.fleet.refunds import order


def run_on_v1(monkeypatch):
    monkeypatch.setattr(versions, "_SETTLED", ["v1"])
    monkeypatch.setattr(get_agent("refunds"), "per_item", True)


def deploy_v2(monkeypatch):
    """This process now runs the fixed code, as version v2."""
    monkeypatch.setattr(versions, "_SETTLED", ["v2"])
    monkeypatch.setattr(get_agent("refunds"), "per_item", False)


def incident(n_failing=3, n_fine=2):
    runs = [services.start_run("refunds", order(k, items=0)) for k in range(n_failing)]
    runs += [services.start_run("refunds", order(100 + k, items=2)) for k in range(n_fine)]
    return [drive(r) for r in runs]


def run_batch(batch):
    """Advance the batch and drive its forks here until it is done."""
    for _ in range(50):
        batches.advance(batch.pk)
        batch.refresh_from_db()
        forks = Run.objects.filter(batch=batch, status__in=("queued", "running"))
        if batch.status != "running" and not forks.exists():
            return batch
        for fork in forks:
            drive(fork)
    raise AssertionError("the batch did not end")
