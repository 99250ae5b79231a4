"""agentrun's OTLP encoding against the OpenTelemetry SDK's own: the same spans, made as SDK
spans and encoded by the OTLP exporter's encoder, give the same request, byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agentrun.telemetry import otlp

RESOURCE = {"service.name": "agentrun", "host.name": "h1", "process.pid": 4242}
_KINDS = {otlp.INTERNAL: SpanKind.INTERNAL, otlp.CLIENT: SpanKind.CLIENT}
_CODES = {otlp.UNSET: StatusCode.UNSET, otlp.OK: StatusCode.OK, otlp.ERROR: StatusCode.ERROR}


def _context(trace_id: int, span_id: int, remote: bool) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(1))


def sdk_request(spans: list[dict]) -> bytes:
    resource = Resource(RESOURCE)
    scope = InstrumentationScope("agentrun")
    made = []
    for s in spans:
        code, message = s.get("status", (otlp.UNSET, ""))
        parent = s["parent_id"] and _context(s["trace_id"], s["parent_id"], s["remote_parent"])
        made.append(
            ReadableSpan(
                name=s["name"],
                context=_context(s["trace_id"], s["span_id"], False),
                parent=parent or None,
                resource=resource,
                attributes=s["attrs"],
                events=[Event(n, a, at) for n, at, a in s["events"]],
                links=[Link(_context(t, i, True), a) for t, i, a in s["links"]],
                kind=_KINDS[s["kind"]],
                status=Status(_CODES[code], message or None),
                start_time=s["start_ns"],
                end_time=s["end_ns"],
                instrumentation_scope=scope,
            )
        )
    return encode_spans(made).SerializeToString()


def our_request(spans: list[dict]) -> bytes:
    resource, scope = otlp.prefix(RESOURCE, "agentrun")
    return otlp.request(resource, scope, [otlp.span(**s) for s in spans])


def assert_same(spans: list[dict]) -> None:
    ours, theirs = our_request(spans), sdk_request(spans)
    assert ExportTraceServiceRequest.FromString(ours) == ExportTraceServiceRequest.FromString(
        theirs
    )
    assert ours == theirs


def a_span(**changes) -> dict:
    span = {
        "trace_id": 0x0F0E0D0C_00004000_80000000_00000001,
        "span_id": 0x1122334455667788,
        "parent_id": 0x0102030405060708,
        "name": "step 7",
        "start_ns": 1_764_000_000_000_000_000,
        "end_ns": 1_764_000_000_004_000_000,
        "attrs": {
            "agentrun.run.id": "0f0e0d0c-0000-4000-8000-000000000001",
            "agentrun.step.number": 7,
            "agentrun.cost_usd": 0.0125,
            "agentrun.reemitted": True,
            "gen_ai.response.finish_reasons": ["stop", "tool_calls"],
        },
        "kind": otlp.INTERNAL,
        "remote_parent": True,
        "events": [],
        "links": [],
    }
    return {**span, **changes}


def test_the_spans_agentrun_emits_encode_as_the_sdk_encodes_them():
    assert_same(
        [
            a_span(),  # a step's span, under its run's root
            a_span(  # a chat span, under the step's: a local parent, a client
                name="chat gpt-4o-mini", kind=otlp.CLIENT, remote_parent=False, span_id=3
            ),
            a_span(  # a failed tool call's, with its retries as events
                name="execute_tool charge",
                events=[("agentrun.attempt_failed", 1_764_000_000_001_000_000, {"a": "é" * 300})],
                status=(otlp.ERROR, "ConnectionError: reset"),
            ),
            a_span(  # a fork's root: no parent, a link to the step it was forked from
                parent_id=0,
                remote_parent=False,
                links=[(7, 9, {"agentrun.link": "forked_from", "agentrun.step.number": 3})],
                status=(otlp.OK, ""),
            ),
            a_span(attrs={}, name=""),  # nothing to say
        ]
    )


_values = st.one_of(
    st.text(max_size=200),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.lists(st.text(max_size=20), max_size=5),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5),
)
_attrs = st.dictionaries(st.text(min_size=1, max_size=40), _values, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    attrs=_attrs,
    name=st.text(max_size=300),
    ids=st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1)),
    times=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    events=st.lists(st.tuples(st.text(max_size=30), st.integers(0, 2**64 - 1), _attrs), max_size=3),
    links=st.lists(
        st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), _attrs), max_size=3
    ),
    status=st.tuples(st.sampled_from([otlp.UNSET, otlp.OK, otlp.ERROR]), st.text(max_size=50)),
    remote=st.booleans(),
)
def test_any_span_encodes_as_the_sdk_encodes_it(
    attrs, name, ids, times, events, links, status, remote
):
    trace_id, span_id, parent_id = ids
    code, message = status
    assert_same(
        [
            a_span(
                trace_id=trace_id,
                span_id=span_id,
                parent_id=parent_id,
                name=name,
                start_ns=times[0],
                end_ns=times[1],
                attrs=attrs,
                events=events,
                links=links,
                # The SDK keeps a description only with an error.
                status=(code, message if code == otlp.ERROR else ""),
                remote_parent=remote,
            )
        ]
    )
