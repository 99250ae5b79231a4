"""A replay batch a real worker runs, traced to an OTLP/HTTP receiver: the batch's span, sent
by the worker that ended the batch, links to the root span of each fork, which links back."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import batches, services
from agentrun.models import ReplayBatch, Run
from agentrun.telemetry import tracing
from tests.base import calls, final, script
from tests.telemetry.otlp import Receiver
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

FAILING = script(calls({"tool": "fail", "args": {"message": "no luck"}}), final())


def root(receiver, trace_hex):
    return next((s for s in receiver.trace(trace_hex) if not s.parent_id), None)


def test_a_batch_run_by_a_worker_and_its_forks_link_to_each_other(start_worker):
    with Receiver() as receiver:
        start_worker(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_SCHEDULE_DELAY="50")
        parents = [services.start_run("scripted", FAILING) for _ in range(2)]
        wait_until(
            lambda: Run.objects.filter(status="failed").count() == 2, timeout=60, what="the runs"
        )
        batch = batches.create({"agent": "scripted", "status": "failed"}, name="again")
        wait_until(
            lambda: ReplayBatch.objects.get(pk=batch.pk).status == "done",
            timeout=60,
            what="the batch",
        )
        forks = list(Run.objects.filter(batch=batch).order_by("batch_item__position"))
        for trace_hex in [batch.pk.hex] + [f.pk.hex for f in forks]:
            wait_until(lambda t=trace_hex: root(receiver, t), timeout=30, what="a root span")

    assert {f.parent_id for f in forks} == {p.pk for p in parents}
    span = root(receiver, batch.pk.hex)
    assert span.name == "invoke_workflow replay_batch"
    assert span.span_id == f"{tracing.batch_span_id(batch.pk):016x}"
    assert span.attributes["agentrun.batch.runs"] == span.attributes["agentrun.batch.runs_linked"] == 2  # fmt: skip
    assert span.attributes["agentrun.batch.verdict.still_failing"] == 2
    roots = [root(receiver, f.pk.hex) for f in forks]
    assert [(link["trace_id"], link["span_id"]) for link in span.links] == [
        (r.trace_id, r.span_id) for r in roots
    ]
    for fork_root in roots:
        assert {"trace_id": span.trace_id, "span_id": span.span_id, "agentrun.link": "batch"} in fork_root.links  # fmt: skip
        assert fork_root.attributes["agentrun.batch.id"] == str(batch.pk)
