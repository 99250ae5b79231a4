"""Tracing in one process: off without an endpoint, content only when asked for (redacted and
cut to size), and the run page's link to the run's trace."""

from __future__ import annotations

import json

import pytest

from agentrun.telemetry import otlp, tracing
from tests.base import calls, drive, final, make_run, script


def test_no_endpoint_no_tracer(monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tracing, "_STATE", {})
    assert tracing.tracer() is None and not tracing.enabled()
    monkeypatch.setattr(tracing, "_STATE", {})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert tracing.tracer() is None


def test_the_console_exporter_prints_otlp_json_with_hex_ids(monkeypatch, capsys):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setattr(tracing, "_STATE", {})
    t = tracing.tracer()
    assert t is not None
    run_id = "0f0e0d0c-0000-4000-8000-000000000001"
    span_id = tracing.step_span_id(run_id, 3, 1)
    data = otlp.span(int(run_id.replace("-", ""), 16), span_id, tracing.root_span_id(run_id),
                     "step 3", 1, 2, {"agentrun.run.id": run_id})  # fmt: skip
    t.emit([(span_id, data)])
    tracing.shutdown()
    printed = json.loads(capsys.readouterr().out)
    (span,) = printed["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert span["traceId"] == run_id.replace("-", "")
    assert span["spanId"] == f"{span_id:016x}"
    assert span["parentSpanId"] == f"{tracing.root_span_id(run_id):016x}"
    assert span["name"] == "step 3"


def test_oversized_values_are_cut_and_say_their_size(settings):
    settings.AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES = 100
    assert tracing.bounded("short") == "short"
    long = "é" * 500  # 1,000 bytes
    cut = tracing.bounded(long)
    assert len(cut.encode()) <= 100 and cut.endswith("… [1000 bytes]")
    assert tracing.bounded({"a": [1, 2]}) == '{"a": [1, 2]}'


@pytest.mark.django_db(transaction=True)
def test_content_is_exported_only_when_asked_and_then_redacted(exported, monkeypatch, settings):
    settings.AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES = 200
    args = {"q": "find", "api_key": "sk-live-0123456789abcdef", "blob": "x" * 1000}
    run = drive(make_run(script(calls({"tool": "echo", "args": args}), final())))
    assert run.status == "succeeded"
    (tool,) = exported.named("execute_tool echo")
    assert not any("arguments" in k or "result" in k for k in tool.attributes)

    exported.spans.clear()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    tracing._STATE.pop("content", None)
    run = drive(make_run(script(calls({"tool": "echo", "args": args}), final())))
    (tool,) = exported.named("execute_tool echo")
    sent = tool.attributes["gen_ai.tool.call.arguments"]
    assert sent.startswith('{"api_key": "[REDACTED]", "blob": "xxx')  # redacted when stored
    assert "sk-live-0123456789abcdef" not in sent
    assert len(sent.encode()) <= 200 and sent.endswith("bytes]")
    assert "gen_ai.tool.call.result" in tool.attributes


@pytest.mark.django_db
def test_the_run_page_links_to_its_trace(client_for, settings):
    run = make_run()
    client = client_for("viewer")
    settings.AGENTRUN_TRACE_URL = ""
    assert 'id="run-trace"' not in client.get(f"/runs/{run.pk}/").content.decode()
    settings.AGENTRUN_TRACE_URL = "https://jaeger.example.com/trace/{trace_id}"
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="https://jaeger.example.com/trace/{run.pk.hex}"' in html
    assert tracing.trace_id_of(run.pk) == run.pk.hex


REQUEST_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST_SPAN = "00f067aa0ba902b7"


@pytest.mark.django_db(transaction=True)
def test_a_run_started_in_a_traced_request_joins_its_trace(exported, people, settings):
    from django.test import Client

    from agentrun.models import ApiToken, Run

    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['operator'])}")
    body = {"agent": "scripted", "input": script(calls({"tool": "echo", "args": {}}), final())}
    response = api.post(
        "/api/runs",
        body,
        content_type="application/json",
        HTTP_TRACEPARENT=f"00-{REQUEST_TRACE}-{REQUEST_SPAN}-01",
    )
    assert response.status_code == 201, response.content
    run = drive(Run.objects.get(pk=response.json()["id"]))
    assert run.trace_parent == f"00-{REQUEST_TRACE}-{REQUEST_SPAN}-01"
    spans = exported.spans
    assert {s.trace_id for s in spans} == {REQUEST_TRACE}
    (root,) = exported.named("invoke_agent scripted")
    assert root.parent_id == REQUEST_SPAN  # under the request's span
    assert tracing.trace_id_of(run) == REQUEST_TRACE
    settings.AGENTRUN_TRACE_URL = "http://jaeger:16686/trace/{trace_id}"
    assert tracing.trace_url(run) == f"http://jaeger:16686/trace/{REQUEST_TRACE}"

    # A malformed header is ignored (W3C Trace Context): the run has a trace of its own.
    for bad in ("00-zz-00f067aa0ba902b7-01", f"00-{'0' * 32}-{REQUEST_SPAN}-01", "x" * 500):
        response = api.post(
            "/api/runs", body, content_type="application/json", HTTP_TRACEPARENT=bad
        )
        assert response.status_code == 201
        started = Run.objects.get(pk=response.json()["id"])
        assert started.trace_parent == "" and tracing.trace_id_of(started) == started.pk.hex


@pytest.mark.django_db(transaction=True)
def test_telemetry_that_fails_does_not_fail_the_step(exported, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("the exporter's bug")

    monkeypatch.setattr(tracing, "emit_step", broken)
    run = drive(make_run())
    assert run.status == "succeeded" and run.steps.filter(crashes__gt=0).count() == 0
    assert "telemetry of step 1 of run" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_run_has_its_root_span_over_its_steps(exported):
    from agentrun.lifecycle import services

    run = drive(make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final())), max_steps=1)
    assert run.status == "running" and run.next_step == 2
    assert not [s for s in exported.spans if s.name.startswith("invoke_agent")]
    services.cancel_run(run, reason="not needed")
    (root,) = exported.named("invoke_agent scripted")
    assert root.parent_id == ""
    assert root.span_id == f"{tracing.root_span_id(run.pk):016x}"
    assert root.trace_id == run.pk.hex
    assert root.attributes["agentrun.run.status"] == "cancelled"
    assert root.attributes["agentrun.steps"] == 1
    assert [e["name"] for e in root.events] == ["agentrun.cancelled"]
    (step,) = exported.named("step 1")
    assert step.parent_id == root.span_id
