"""Repairing a fleet with real workers of two code versions.

Worker v1 runs the `refunds` agent with its bug: the runs of orders without items fail.
A sandbox batch onto v2 waits, visibly, while no v2 worker is alive; a v2 worker starts
and fixes every run without a side effect, while v1 never touches a fork. Promoting the
batch pays each refund exactly once; the parents are untouched. A cancelled batch makes
no new forks and lets the one it made finish.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.test import Client

from agentrun.engine import versions
from agentrun.lifecycle import batches, services
from agentrun.models import LedgerEntry, LedgerInvocation, ReplayBatch, Run, Step
from tests.base import make_people
from tests.fleet.refunds import order
from tests.workers import Worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

FAILING, FINE = 4, 2


def ended(runs):
    return lambda: all(r.status in ("succeeded", "failed", "cancelled") for r in fresh(runs))


def fresh(runs):
    return list(Run.objects.filter(pk__in=[r.pk for r in runs]).order_by("created_at"))


def batch_done(batch_id):
    return lambda: (
        ReplayBatch.objects.get(pk=batch_id).status in ("done", "cancelled")
        and not (
            Run.objects.filter(
                batch_id=batch_id, status__in=("queued", "running", "waiting")
            ).exists()
        )
    )


@pytest.fixture
def v1(tmp_path, settings):
    settings.AGENTRUN_ENQUEUE = True
    worker = Worker(
        tmp_path,
        beat=True,
        AGENTRUN_AGENT_MODULES="tests.fleet.refunds_v1",
        AGENTRUN_CODE_VERSION="v1",
        AGENTRUN_WORKER_HEARTBEAT_SECONDS="0.5",
    )
    yield worker
    worker.stop()


def start_v2(tmp_path):
    return Worker(
        tmp_path,
        AGENTRUN_AGENT_MODULES="tests.fleet.refunds_v2",
        AGENTRUN_CODE_VERSION="v2",
        AGENTRUN_WORKER_HEARTBEAT_SECONDS="0.5",
    )


def test_a_fleet_repaired_on_the_fixed_version_sandbox_first(v1, tmp_path, settings, on_v1):
    settings.AGENTRUN_WORKER_HEARTBEAT_SECONDS = 0.5
    operator = make_people()["operator"]
    parents = [services.start_run("refunds", order(k, items=0)) for k in range(FAILING)]
    parents += [services.start_run("refunds", order(100 + k, items=1)) for k in range(FINE)]
    wait_until(ended(parents), timeout=120, what="v1 runs the incident")
    parents = fresh(parents)
    assert Counter(p.status for p in parents) == {"failed": FAILING, "succeeded": FINE}
    assert {p.code_version for p in parents} == {"v1"}
    before = {p.pk: (p.status, p.next_step, p.error, p.finished_at) for p in parents}
    ledger = LedgerEntry.objects.count()
    assert ledger == FINE

    # No v2 worker yet: the batch's forks wait for one, and say so.
    sandbox = batches.create(
        {"agent": "refunds", "status": "failed"},
        "before-failure",
        mode="sandbox",
        version="v2",
        name="refunds, fixed in v2",
        user=operator,
    )
    wait_until(lambda: Run.objects.filter(batch=sandbox).count() == FAILING, timeout=30)
    time.sleep(2)  # the v1 worker and its reconciler had every chance to take them
    forks = Run.objects.filter(batch=sandbox)
    assert {f.status for f in forks} == {"queued"}
    client = Client()
    client.force_login(operator)
    versions.forget_versions_alive()
    shown = client.get(f"/api/runs/{forks[0].pk}").json()
    assert shown["target_version"] == "v2" and shown["waiting_for_version"] is True

    v2 = start_v2(tmp_path)
    try:
        wait_until(batch_done(sandbox.pk), timeout=120, what="the sandbox batch ends")
        counts = batches.counts(ReplayBatch.objects.get(pk=sandbox.pk))
        assert counts["verdicts"]["fixed"] == FAILING, counts
        assert LedgerEntry.objects.count() == ledger  # sandbox: no refund paid
        fork_steps = Step.objects.filter(run__batch=sandbox)
        assert set(fork_steps.values_list("code_version", flat=True)) == {"v2"}
        assert {p.pk: (p.status, p.next_step, p.error, p.finished_at) for p in fresh(parents)} == (
            before
        )

        live = batches.promote(
            ReplayBatch.objects.get(pk=sandbox.pk), user=operator, confirm_live=True
        )
        wait_until(batch_done(live.pk), timeout=120, what="the live batch ends")
        assert batches.counts(ReplayBatch.objects.get(pk=live.pk))["verdicts"]["fixed"] == FAILING
        paid = LedgerEntry.objects.filter(run__batch=live)
        assert sorted(paid.values_list("account", flat=True)) == [
            f"order-{k}" for k in range(FAILING)
        ]
        invocations = LedgerInvocation.objects.filter(
            run_id__in=[r.pk for r in Run.objects.filter(batch=live)]
        )
        assert sorted(invocations.values_list("count", flat=True)) == [1] * FAILING
        assert LedgerEntry.objects.count() == ledger + FAILING

    finally:
        v2.stop()

    # Cancelled after its first fork (which waits: v2 is down): no more forks; that one
    # runs when a v2 worker is back, and ends with its verdict.
    versions.forget_versions_alive()
    slow = batches.create(
        {"agent": "refunds", "status": "failed"},
        mode="sandbox",
        version="v2",
        name="one at a time",
        max_in_flight=1,
        user=operator,
    )
    wait_until(lambda: Run.objects.filter(batch=slow).exists(), timeout=30)
    batches.cancel(ReplayBatch.objects.get(pk=slow.pk), user=operator, reason="enough")
    again = start_v2(tmp_path)
    try:
        wait_until(batch_done(slow.pk), timeout=60, what="the cancelled batch's fork ends")
        time.sleep(1.5)  # a reconciler pass or two: still no new fork
    finally:
        again.stop()
    assert Run.objects.filter(batch=slow).count() == 1
    counts = batches.counts(ReplayBatch.objects.get(pk=slow.pk))
    assert counts["runs"]["skipped"] == FAILING - 1 and counts["verdicts"]["fixed"] == 1
    for worker in (v1, v2, again):
        assert "Traceback" not in worker.text(), worker.text()[-3000:]
