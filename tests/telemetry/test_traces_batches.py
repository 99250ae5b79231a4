"""A replay batch is a trace of its own, its id the batch's: one span from the batch's
creation to its end, linked to each fork's root span, and each fork's root linked back to
it, also when the fork's spans are emitted again from the rows."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agentrun.lifecycle import batches
from agentrun.models import Run, Step
from agentrun.telemetry import tracing
from tests.base import make_people
from tests.fleet.scenario import deploy_v2, incident, run_batch

pytestmark = pytest.mark.django_db(transaction=True)

FAILED = {"agent": "refunds", "status": "failed"}


def batch_span(exported, batch):
    (span,) = [s for s in exported.spans if s.trace_id == batch.pk.hex]
    assert span.name == "invoke_workflow replay_batch" and span.parent_id == ""
    assert span.span_id == f"{tracing.batch_span_id(batch.pk):016x}"
    return span


def fork_roots(exported, forks):
    """Each fork's root span, in the order of `forks`."""
    roots = {s.trace_id: s for s in exported.named("invoke_agent refunds")}
    return [roots[f.pk.hex] for f in forks]


def links_to(span):
    return [(link["trace_id"], link["span_id"]) for link in span.links]


def root_of(run):
    return (run.pk.hex, f"{tracing.root_span_id(run.pk):016x}")


def batch_of(batch):
    return (batch.pk.hex, f"{tracing.batch_span_id(batch.pk):016x}")


def test_a_batch_span_links_to_its_forks_and_they_to_it(exported, on_v1, monkeypatch):
    incident(n_failing=3, n_fine=0)
    deploy_v2(monkeypatch)
    operator = make_people()["operator"]
    batch = batches.create(FAILED, mode="sandbox", version="v2", name="refunds", user=operator)
    batch = run_batch(batch)
    assert batch.status == "done"
    forks = list(Run.objects.filter(batch=batch).order_by("batch_item__position"))
    assert len(forks) == 3

    span = batch_span(exported, batch)
    assert span.start_ns == int(batch.created_at.timestamp() * 1e9)
    assert span.end_ns == int(batch.finished_at.timestamp() * 1e9)
    attributes = span.attributes
    assert attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert attributes["agentrun.batch.id"] == str(batch.pk)
    assert (attributes["agentrun.batch.mode"], attributes["agentrun.batch.status"]) == ("sandbox", "done")  # fmt: skip
    assert attributes["agentrun.batch.url"].endswith(f"/batches/{batch.pk}/")
    assert attributes["agentrun.batch.created_by"] == operator.username
    assert attributes["agentrun.batch.runs"] == attributes["agentrun.batch.runs_linked"] == 3
    assert attributes["agentrun.batch.verdict.fixed"] == 3
    assert attributes["agentrun.batch.running"] == 0

    # The batch links to each fork's root span, as it was received, and each links back.
    roots = fork_roots(exported, forks)
    assert links_to(span) == [(r.trace_id, r.span_id) for r in roots] == [root_of(f) for f in forks]
    assert [link["agentrun.batch.verdict"] for link in span.links] == ["fixed"] * 3
    for fork, root in zip(forks, roots, strict=True):
        assert batch_of(batch) in links_to(root)
        assert root.attributes["agentrun.batch.id"] == str(batch.pk)
        assert root.attributes["agentrun.forked_from.run_id"] == str(fork.parent_id)

    # Emitted again from the rows, a fork's root is the same span with the same links.
    fork = forks[0]
    exported.spans.clear()
    Step.objects.filter(run=fork, number=fork.next_step - 1).update(trace_due_at=timezone.now())
    assert tracing.emit_lost() == 1
    (again,) = fork_roots(exported, [fork])
    assert (again.trace_id, again.span_id) == (roots[0].trace_id, roots[0].span_id)
    assert links_to(again) == links_to(roots[0])
    assert again.attributes["agentrun.batch.id"] == str(batch.pk)


def test_a_cancelled_batch_ends_its_span_with_the_forks_it_made(exported, on_v1, monkeypatch):
    incident(n_failing=3, n_fine=0)
    deploy_v2(monkeypatch)
    batch = batches.create(FAILED, mode="sandbox", version="v2", name="refunds", max_in_flight=1)
    batches.advance(batch.pk)
    assert not [s for s in exported.spans if s.trace_id == batch.pk.hex]
    batch = batches.cancel(batch, user=None)
    (fork,) = Run.objects.filter(batch=batch)

    span = batch_span(exported, batch)
    assert span.end_ns == int(batch.finished_at.timestamp() * 1e9)
    assert [e["name"] for e in span.events] == ["agentrun.cancelled"]
    attributes = span.attributes
    assert attributes["agentrun.batch.status"] == "cancelled"
    assert (attributes["agentrun.batch.items"], attributes["agentrun.batch.skipped"]) == (3, 2)
    assert attributes["agentrun.batch.runs"] == attributes["agentrun.batch.running"] == 1
    assert links_to(span) == [root_of(fork)]


def test_a_batch_links_as_many_forks_as_a_span_keeps_and_says_how_many(
    exported, on_v1, monkeypatch
):
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "2")
    incident(n_failing=3, n_fine=0)
    deploy_v2(monkeypatch)
    batch = run_batch(batches.create(FAILED, mode="sandbox", version="v2", name="refunds"))
    forks = list(Run.objects.filter(batch=batch).order_by("batch_item__position"))
    span = batch_span(exported, batch)
    assert (span.attributes["agentrun.batch.runs"], span.attributes["agentrun.batch.runs_linked"]) == (3, 2)  # fmt: skip
    assert links_to(span) == [root_of(f) for f in forks[:2]]


def test_a_batch_span_that_fails_does_not_fail_the_batch(exported, on_v1, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("the exporter's bug")

    monkeypatch.setattr(tracing, "_batch_span", broken)
    incident(n_failing=2, n_fine=0)
    batch = batches.create(FAILED, mode="sandbox", name="refunds", max_in_flight=1)
    batch = batches.cancel(batch, user=None)
    assert batch.status == "cancelled"
    assert f"the span of replay batch {batch.pk} failed" in caplog.text


def test_a_promoted_batch_links_to_the_sandbox_batch_it_came_from(exported, on_v1, monkeypatch):
    incident(n_failing=2, n_fine=0)
    deploy_v2(monkeypatch)
    sandbox = run_batch(batches.create(FAILED, mode="sandbox", version="v2", name="refunds"))
    live = run_batch(batches.promote(sandbox, user=None, confirm_live=True))
    span = batch_span(exported, live)
    assert span.attributes["agentrun.batch.mode"] == "live"
    assert span.attributes["agentrun.batch.promoted_from"] == str(sandbox.pk)
    assert span.attributes["agentrun.batch.runs"] == span.attributes["agentrun.batch.runs_linked"] == 2  # fmt: skip
    (promoted_from,) = [x for x in span.links if x["agentrun.link"] == "promoted_from"]
    sandbox_span = batch_span(exported, sandbox)
    assert (promoted_from["trace_id"], promoted_from["span_id"]) == batch_of(sandbox)
    assert batch_of(sandbox) == (sandbox_span.trace_id, sandbox_span.span_id)
