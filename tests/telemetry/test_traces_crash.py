"""A worker SIGKILLed between its commits and its spans' export loses no step's spans: the
reconciler emits them again from the committed rows, and every committed step ends up with
exactly one successful step span at the receiver."""

from __future__ import annotations

import signal
import time

import pytest

from agentrun.models import Run, Step
from agentrun.telemetry import tracing
from tests.base import calls, final, make_run, script
from tests.telemetry.otlp import Receiver
from tests.workers import decided, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]

ENDED = ("committed", "finished", "failed")


def test_a_killed_workers_committed_steps_have_their_spans_once(start_worker):
    with Receiver() as receiver:
        # The first worker keeps its spans in memory (its batch is exported every ten
        # minutes) and runs no reconciler: a kill takes them all.
        first = start_worker(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="600000",
            AGENTRUN_TRACE_REEMIT_AFTER="2",
        )
        run = make_run(
            script(
                calls({"tool": "echo", "args": {"n": 1}}),
                calls({"tool": "echo", "args": {"n": 2}}, {"tool": "echo", "args": {"n": 3}}),
                calls({"tool": "sleep", "args": {"seconds": 3}}),
                final("done"),
            )
        )
        wait_until(decided(run, 3), what="step 3")
        time.sleep(0.5)
        first.signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
        # Steps 1 and 2 are committed, and not one of their spans left the process.
        lost = Step.objects.filter(run=run, status="succeeded", trace_due_at__isnull=False)
        assert sorted(lost.values_list("number", flat=True)) == [1, 2]
        assert receiver.trace(run.pk.hex) == []

        start_worker(
            beat=True,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="50",
            AGENTRUN_TRACE_REEMIT_AFTER="2",
        )
        wait_until(
            lambda: Run.objects.filter(pk=run.pk, status="succeeded").exists(),
            timeout=90,
            what="the run to finish",
        )
        wait_until(
            lambda: not Step.objects.filter(run=run, trace_due_at__isnull=False).exists(),
            timeout=60,
            what="every step's spans exported",
        )
        time.sleep(3)  # a pass more of the reconciler: it must send nothing twice

    spans = receiver.trace(run.pk.hex)
    steps = {s.number: s for s in Step.objects.filter(run=run)}
    assert sorted(steps) == [1, 2, 3, 4]
    assert steps[3].attempts == 2  # the killed attempt, then the one that committed
    for number, step in steps.items():
        ended = [
            s
            for s in spans
            if s.name == f"step {number}" and s.attributes["agentrun.step.outcome"] in ENDED
        ]
        assert len(ended) == 1, (number, [s.attributes for s in ended])
        assert ended[0].span_id == f"{tracing.step_span_id(run.pk, number, step.attempts):016x}"
    roots = [s for s in spans if not s.parent_id]
    assert [r.name for r in roots] == ["invoke_agent scripted"]
    assert roots[0].span_id == f"{tracing.root_span_id(run.pk):016x}"
    # What was emitted again from the rows is the tree the live path makes: the steps'
    # tool calls under their step spans, with the call's attributes.
    by_id = {s.span_id: s for s in spans}
    tools = [s for s in spans if s.name == "execute_tool echo"]
    assert len(tools) == 3
    assert sorted(by_id[t.parent_id].name for t in tools) == ["step 1", "step 2", "step 2"]
    assert all(t.attributes["agentrun.tool.status"] == "ok" for t in tools)
    assert (
        by_id[tools[0].parent_id]
        .attributes["agentrun.step.url"]
        .endswith(
            f"/runs/{run.pk}/steps/{by_id[tools[0].parent_id].attributes['agentrun.step.number']}/"
        )
    )
    # Emitted again by the replacement, they say so, and which worker ran the step.
    assert all(
        s.attributes.get("agentrun.reemitted")
        for s in by_id.values()
        if s.name in ("step 1", "step 2")
    )
    assert by_id[tools[0].parent_id].attributes["agentrun.worker"] == steps[1].worker != ""
    assert not any(
        s.attributes.get("agentrun.reemitted") for s in spans if s.name in ("step 3", "step 4")
    )
    assert all(s.resource.get("process.pid") for s in spans)
    # Each span once: the re-emitted ones too.
    assert len({s.span_id for s in spans}) == len(spans)
