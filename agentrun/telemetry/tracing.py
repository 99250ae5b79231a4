"""OpenTelemetry traces: a run is a trace, following the GenAI semantic conventions.

Configured by the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
`OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`...); with no endpoint (or `OTEL_TRACES_EXPORTER=none`)
there is no tracer and a step pays one check.

The trace id is the run's id (a UUID is 128 bits, as a trace id is), and the span ids of a
run's root span and of each step attempt (and its model request's and tool calls') are
derived from the run id, step and attempt: every worker that executes a step of the run puts
its spans in the same tree, with nothing shared but the run id, a fork's root span links to
the span of the step it was forked from, and a step emitted again repeats its spans' ids. An
attempt that waits for an approval goes on under its number once approved: its span's id
is random.

- `invoke_agent {agent}`: the root, emitted when the run ends (start: the run's start);
- `step {n}`: each step attempt, marked with its outcome (committed, finished, failed,
  backoff, waiting, lost, crashed), with the run id, step number and the step's debugger URL;
- `chat {model}`: the step's model request, with `gen_ai.*` usage attributes;
- `execute_tool {tool}`: each tool call the attempt ran, retries as span events;
- `invoke_workflow replay_batch`: a replay batch, a trace of its own (its id the batch's),
  emitted when the batch ends, linked to its forks' roots, which link back to it.

Spans are emitted when the attempt ends, from what it wrote, encoded to OTLP there
(`agentrun.telemetry.otlp`); the SDK samples, batches and posts them. Arguments, results and
messages are not exported unless `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is
true, and then as stored (redacted), cut to AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import random
import re
import socket
import threading
from datetime import datetime, timedelta
from time import time_ns
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from agentrun.telemetry import otlp

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
#: Outcomes of an attempt that committed its step.
ENDED = ("committed", "finished", "failed")
_STATE: dict[str, Any] = {}  # "tracer" once configured (None: tracing is off), "content"


class Exporting:
    """A process's trace export: the SDK's sampler (OTEL_TRACES_SAMPLER) and span processor
    (the batch one: OTEL_BSP_*), fed spans that are encoded already (`agentrun.telemetry.otlp`)."""

    def __init__(self, sampler: Any, processor: Any) -> None:
        self.sampler = sampler
        self.processor = processor
        # A root without a parent is always sampled (the default, ParentBased(AlwaysOn)).
        self.always = sampler.get_description().startswith(
            ("AlwaysOnSampler", "ParentBased{root:AlwaysOnSampler")
        )

    def sampled(self, trace_id: int) -> bool:
        """The sampler's decision for a run's trace: the same in every process (by trace id)."""
        if self.always:  # the default sampler: no need to ask it for every step
            return True
        return self.sampler.should_sample(None, trace_id, "invoke_agent").decision.is_sampled()

    def emit(self, spans: list[tuple[int, bytes]]) -> None:
        for span_id, data in spans:
            self.processor.on_end(_Encoded(span_id, data))


class _Encoded:
    """A span, encoded, as the SDK's span processors take one: they ask it only whether it
    is sampled, and hand it to the exporter."""

    __slots__ = ("span_id", "data")
    context = SpanContext(1, 1, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    def __init__(self, span_id: int, data: bytes) -> None:
        self.span_id = span_id
        self.data = data


def enabled() -> bool:
    """Whether traces are exported (OTEL_* variables), read once per process."""
    return tracer() is not None


def tracer() -> Exporting | None:
    if "tracer" not in _STATE:
        with _LOCK:
            if "tracer" not in _STATE:
                _STATE["tracer"] = _configure()
    return _STATE["tracer"]


def _configure() -> Exporting | None:
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if kind == "none" or (not endpoint and kind not in ("otlp", "console")):
        return None
    attributes: dict[str, Any] = {"host.name": socket.gethostname(), "process.pid": os.getpid()}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "agentrun"
    # The resource adds OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the sampler comes
    # from OTEL_TRACES_SAMPLER(_ARG).
    resource = Resource.create(attributes)
    sampler = TracerProvider(resource=resource).sampler
    if kind == "console":
        send = _print
        close = None
    else:
        # OTLP over HTTP (protobuf): the SDK's exporter reads its endpoint, headers, timeout
        # and compression from the OTEL_EXPORTER_OTLP_* variables itself, and its client
        # posts a request encoded already, with the exporter's retries.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        client = exporter._client

        def send(data: bytes) -> bool:
            return bool(client.export(data).success)

        close = exporter.shutdown
    processor = BatchSpanProcessor(Exporter(send, dict(resource.attributes), close))
    log.info("traces exported (%s)", endpoint or kind)
    return Exporting(sampler, processor)


def _print(data: bytes) -> bool:
    """A batch on standard output, in OTLP's JSON form (ids in hex, as tracing UIs show them)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    print(json.dumps(_hex_ids(MessageToDict(ExportTraceServiceRequest.FromString(data))),
                     indent=2), flush=True)  # fmt: skip
    return True


_IDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(value: Any) -> Any:
    """Protobuf's JSON mapping writes bytes in base64; OTLP/JSON writes ids in hex."""
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    if isinstance(value, dict):
        return {
            k: base64.b64decode(v).hex() if k in _IDS else _hex_ids(v) for k, v in value.items()
        }
    return value


class Exporter(SpanExporter):
    """Posts a batch of encoded spans as one request (`send`: True once it was accepted),
    then marks each committed step whose spans it exported: a step not marked is emitted
    again, from its rows, by the reconciler (`emit_lost`)."""

    def __init__(self, send: Any, resource: dict[str, Any], close: Any = None) -> None:
        self.send = send
        self.close = close
        self.resource, self.scope = otlp.prefix(resource, "agentrun")

    def export(self, spans: Any) -> SpanExportResult:
        data = otlp.request(self.resource, self.scope, [s.data for s in spans])
        try:
            ok = self.send(data)
        except Exception:
            log.exception("exporting %d span(s) failed", len(spans))
            ok = False
        with _LOCK:  # which steps have all their spans exported now
            done: list[int] = []
            for span in spans:
                step = _WAITING.pop(span.span_id, None)
                left = _EXPECTED.get(step) if step is not None else None
                if step is None or left is None:
                    continue
                left.discard(span.span_id)
                if not ok:
                    del _EXPECTED[step]  # lost here: the reconciler emits it again
                elif not left:
                    del _EXPECTED[step]
                    done.append(step)
        if done:
            _mark_exported(done)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        if self.close is not None:
            self.close()


#: Committed steps whose spans are not all exported yet: step id -> span ids, and each
#: span id -> its step. Bounded: a span the batch processor dropped never comes back.
_EXPECTED: dict[int, set[int]] = {}
_WAITING: dict[int, int] = {}
_MAX_WAITING = 100_000


def _expect(step_pk: int, span_ids: list[int]) -> None:
    with _LOCK:
        _EXPECTED[step_pk] = set(span_ids)
        for span_id in span_ids:
            _WAITING[span_id] = step_pk
        while len(_WAITING) > _MAX_WAITING:  # the oldest first (dicts keep their order)
            _EXPECTED.pop(_WAITING.pop(next(iter(_WAITING))), None)


def _mark_exported(step_ids: list[int]) -> None:
    from django.db import DEFAULT_DB_ALIAS, connections

    from agentrun.models import Step

    try:
        Step.objects.filter(pk__in=step_ids, trace_due_at__isnull=False).update(trace_due_at=None)
    except Exception:  # the spans are out; the step is emitted again, and the receiver
        log.exception("marking %d step(s) exported failed", len(step_ids))  # keeps one
    conn = connections[DEFAULT_DB_ALIAS]
    # The batch processor's thread hands its connection back to the pool, if there is one.
    if getattr(conn, "pool", None) is not None and not conn.in_atomic_block:
        conn.close()


def export_pending(run: Any, now: datetime) -> dict[str, Any]:
    """The commit's mark of a step whose spans this process is to export: when they are
    emitted again unless their export is on record first (`trace_due_at`), or nothing when
    traces are off or the run's trace is not sampled."""
    t = tracer()
    if t is None or not t.sampled(_trace_int(run)):
        return {}
    return {"trace_due_at": now + timedelta(seconds=settings.AGENTRUN_TRACE_REEMIT_AFTER)}


def prepare() -> None:
    """What the first span would pay otherwise, paid when a worker starts: the exporter's
    configuration, and the URL configuration that step links are reversed from (a second)."""
    if tracer() is not None:
        step_url(_SAMPLE_RUN, 1)


def shutdown() -> None:
    """Export what is buffered (a worker that stops); spans after this are dropped."""
    t = _STATE.get("tracer")
    if t is not None:
        t.processor.shutdown()


def flush() -> None:
    t = _STATE.get("tracer")
    if t is not None:
        t.processor.force_flush()


# --- ids ----------------------------------------------------------------------------------

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse_traceparent(value: Any) -> str:
    """A W3C traceparent header as stored (version 00, lower case), or "" when it is
    missing or not one (the standard says to ignore a malformed one, not to refuse)."""
    if not isinstance(value, str):
        return ""
    match = _TRACEPARENT.match(value.strip().lower())
    if not match or set(match[1]) == {"0"} or set(match[2]) == {"0"}:
        return ""
    return match[0]


def trace_id_of(run: Any) -> str:
    """The run's trace id, as tracing UIs show it (32 hex digits): the trace of the request
    that started it, if a traced one did, else the run's own id."""
    return f"{_trace_int(run):032x}"


def _trace_int(run: Any) -> int:
    """`run`: a Run (its trace_parent counts) or a run id."""
    parent = getattr(run, "trace_parent", "")
    if parent:
        return int(parent[3:35], 16)
    run_id = getattr(run, "pk", run)
    return int(str(run_id).replace("-", ""), 16) or 1


def _span_int(*parts: Any) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def root_span_id(run_id: Any) -> int:
    return _span_int(run_id, "run")


def step_span_id(run_id: Any, number: int, attempt: int) -> int:
    return _span_int(run_id, "step", number, attempt)


# --- attributes ---------------------------------------------------------------------------


def capture_content() -> bool:
    """Whether spans carry arguments, results and the model's messages (off by default)."""
    if "content" not in _STATE:
        value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
        _STATE["content"] = value.strip().lower() in ("1", "true", "yes", "on")
    return _STATE["content"]


def bounded(value: Any) -> str:
    """Text for an attribute, at most AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES (UTF-8) long: a
    longer one is cut, and says how many bytes it had (oversized spans break exporters)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    limit = settings.AGENTRUN_TRACE_MAX_ATTRIBUTE_BYTES
    raw = text.encode()
    if len(raw) <= limit:
        return text
    note = f"… [{len(raw)} bytes]"
    return raw[: max(limit - len(note.encode()), 0)].decode(errors="ignore") + note


_URL: list[str] = []  # the step page's address, {run} and {n} to fill in (reversed once)
_SAMPLE_RUN = "00000000-0000-4000-8000-000000000000"


def step_url(run_id: Any, number: int) -> str:
    """The step's page in the debugger (AGENTRUN_SITE_URL and the page's path)."""
    if not _URL:
        from django.urls import reverse

        path = reverse("debugger:run-step", kwargs={"run_id": _SAMPLE_RUN, "number": 7})
        _URL.append(path.replace(_SAMPLE_RUN, "{run}").replace("/7/", "/{n}/"))
    return settings.AGENTRUN_SITE_URL + _URL[0].format(run=run_id, n=number)


def trace_url(run: Any) -> str:
    """The run's trace in the operator's tracing UI (AGENTRUN_TRACE_URL), or ""."""
    template = settings.AGENTRUN_TRACE_URL
    return template.replace("{trace_id}", trace_id_of(run)) if template else ""


# --- spans --------------------------------------------------------------------------------


def emit_step(ctx: Any, outcome: str, detail: str, start_ns: int, end_ns: int) -> None:
    """The spans of one step attempt that just ended (and the run's root, if it ended)."""
    t = tracer()
    if t is None:
        return
    run, step = ctx.run, ctx.step
    trace_id = _trace_int(run)
    if not t.sampled(trace_id):
        return
    run_id = str(run.pk)
    if outcome == "waiting":  # the attempt goes on after the approval, under the same number
        span_id = random.getrandbits(64) or 1
    else:
        span_id = step_span_id(run_id, step.number, step.attempts)
    attributes = {
        "agentrun.run.id": run_id,
        "agentrun.step.number": step.number,
        "gen_ai.agent.name": run.agent,
        "agentrun.step.attempt": step.attempts,
        "agentrun.step.outcome": outcome,
        "agentrun.step.url": step_url(run_id, step.number),
        "agentrun.code_version": run.code_version or "",
    }
    if getattr(ctx, "reemitted", False):  # by another process: the resource isn't its worker's
        attributes["agentrun.worker"] = ctx.owner
        attributes["agentrun.reemitted"] = True
    events = []
    if outcome in ("backoff", "waiting", "lost"):
        events.append((f"agentrun.{outcome}", end_ns, {"agentrun.detail": bounded(detail)}))
    status = (otlp.UNSET, "")
    if outcome in ("failed", "crashed"):
        status = (otlp.ERROR, bounded(detail)[:512])
        attributes["error.type"] = _error_type(ctx, detail)
    # The model request and tool calls are the step span's children: the run, step and
    # agent are on it, not repeated on them. Their ids are derived too, so a step emitted
    # again from its rows repeats its spans, which receivers keep once.
    ids = (run_id, step.number, step.attempts)
    spans = [_chat_span(ctx, trace_id, span_id, ids)]
    spans += [
        _tool_span(tc, call_id, before, trace_id, span_id, ids) for tc, call_id, before in ctx.acted
    ]
    root = root_span_id(run_id)
    spans.append((
        span_id,
        otlp.span(trace_id, span_id, root, f"step {step.number}", start_ns, end_ns, attributes,
                  remote_parent=True, events=events, status=status),
    ))  # fmt: skip
    if outcome in ("finished", "failed"):  # the run ended with this step
        spans.append(_root_span(ctx, outcome, detail, end_ns, trace_id))
    ended = [s for s in spans if s is not None]
    if outcome in ENDED and ctx.step.pk is not None:
        # Known before any of them is handed over (the batch may be exported at once).
        _expect(ctx.step.pk, [i for i, _ in ended])
    t.emit(ended)


def _error_type(ctx: Any, detail: str) -> str:
    failure = ctx.failure or {}
    return str(failure.get("type") or detail.split(":", 1)[0] or "error")[:100]


def _chat_span(ctx: Any, trace_id: int, parent: int, ids: tuple) -> tuple[int, bytes] | None:
    if ctx.llm_window is None or ctx.decision is None or not ctx.decision.llm:
        return None
    llm = ctx.decision.llm
    response = llm.get("response") if isinstance(llm.get("response"), dict) else {}
    model = str(llm.get("model") or "")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": str(llm.get("provider") or "openai"),
        "gen_ai.request.model": model,
        "gen_ai.usage.input_tokens": int(llm.get("tokens_in") or 0),
        "gen_ai.usage.output_tokens": int(llm.get("tokens_out") or 0),
    }
    if response.get("model"):
        attributes["gen_ai.response.model"] = str(response["model"])
    if response.get("id"):
        attributes["gen_ai.response.id"] = str(response["id"])[:200]
    reasons = [
        str(c.get("finish_reason"))
        for c in response.get("choices") or []
        if isinstance(c, dict) and c.get("finish_reason")
    ]
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = reasons
    if llm.get("tokens_cached"):
        attributes["gen_ai.usage.cache_read.input_tokens"] = int(llm["tokens_cached"])
    if llm.get("cost_usd") is not None:
        attributes["agentrun.cost_usd"] = float(llm["cost_usd"])
    if capture_content():
        attributes["gen_ai.output.messages"] = bounded(
            [c.get("message") for c in response.get("choices") or [] if isinstance(c, dict)]
        )
    start_ns, end_ns = ctx.llm_window
    span_id = _span_int(*ids, "chat")
    data = otlp.span(trace_id, span_id, parent, f"chat {model}", start_ns, end_ns, attributes,
                     kind=otlp.CLIENT)  # fmt: skip
    return span_id, data


def _tool_span(
    tc: Any, call_id: str | None, before: int, trace_id: int, parent: int, ids: tuple
) -> tuple[int, bytes] | None:
    """The call's span, if this step attempt ran it (`before`: its attempts until then)."""
    attempts = []
    for a in (tc.attempts or [])[before:]:
        try:
            attempts.append((int(datetime.fromisoformat(a["at"]).timestamp() * 1e9), a))
        except (KeyError, TypeError, ValueError):
            continue
    if not attempts:
        return None
    start_ns = attempts[0][0]
    last_at, last = attempts[-1]
    end_ns = last_at + int(float(last.get("duration_ms") or 0) * 1e6)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tc.tool,
        "gen_ai.tool.type": "function",
        "agentrun.tool.kind": tc.kind,
        "agentrun.tool.status": tc.status,
        "agentrun.tool.idempotency_key": tc.idempotency_key,
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if capture_content():
        attributes["gen_ai.tool.call.arguments"] = bounded(tc.args)
        if tc.result is not None:
            attributes["gen_ai.tool.call.result"] = bounded(tc.result)
    events = []
    for at, a in attempts:
        if a.get("error"):
            event: dict[str, Any] = {"agentrun.error": bounded(a["error"])}
            if a.get("backoff_s") is not None:
                event["agentrun.backoff_s"] = float(a["backoff_s"])
            events.append(("agentrun.attempt_failed", at, event))
    status = (otlp.UNSET, "")
    if tc.status in ("failed", "in_doubt"):
        status = (otlp.ERROR, bounded(tc.error or tc.status)[:512])
        attributes["error.type"] = (tc.error or tc.status).split(":", 1)[0][:100]
    span_id = _span_int(*ids, "tool", tc.index, before)
    data = otlp.span(trace_id, span_id, parent, f"execute_tool {tc.tool}", start_ns,
                     max(end_ns, start_ns), attributes, events=events, status=status)  # fmt: skip
    return span_id, data


def _root_span(
    ctx: Any, outcome: str, detail: str, end_ns: int, trace_id: int, events: tuple = ()
) -> tuple[int, bytes]:
    run = ctx.run
    run_id = str(run.pk)
    started = run.started_at or run.created_at
    start_ns = int(started.timestamp() * 1e9) if started else end_ns
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": run.agent,
        "agentrun.run.id": run_id,
        "agentrun.run.status": _RUN_STATUS.get(outcome, "succeeded"),
        "agentrun.run.url": step_url(run_id, ctx.step.number).rsplit("/steps/", 1)[0] + "/",
        "agentrun.steps": ctx.step.number + 1 - run.first_step,
    }
    link = _fork_link(run) if run.parent_id and run.forked_from_id else None
    links = [link] if link else []
    if link is not None:
        # Said as attributes too: some receivers (Phoenix) keep no links.
        attributes["agentrun.forked_from.run_id"] = str(run.parent_id)
        attributes["agentrun.forked_from.step"] = link[2]["agentrun.step.number"]
        attributes["agentrun.forked_from.span_id"] = f"{link[1]:016x}"
    if run.batch_id is not None:  # a replay batch's fork: linked to the batch's span
        attributes["agentrun.batch.id"] = str(run.batch_id)
        links.append(_batch_link(run.batch_id))
    status = (otlp.UNSET, "")
    if outcome == "failed":
        status = (otlp.ERROR, bounded(detail)[:512])
        attributes["error.type"] = _error_type(ctx, detail)
    # A child of the span of the request that started the run, or the root of a trace of
    # its own, whose id is the run's.
    parent = int(run.trace_parent[36:52], 16) if run.trace_parent else 0
    span_id = root_span_id(run_id)
    data = otlp.span(
        trace_id, span_id, parent, f"invoke_agent {run.agent}", min(start_ns, end_ns), end_ns,
        attributes, remote_parent=True, events=events, links=links, status=status,
    )  # fmt: skip
    return span_id, data


_RUN_STATUS = {"failed": "failed", "cancelled": "cancelled"}


def emit_cancelled(run: Any) -> None:
    """The root span of a run an operator cancelled (no worker ends it): its steps so far
    under it, as for a run that ended. Never raises: the cancel is committed already."""
    try:
        t = tracer()
        if t is None or not t.sampled(_trace_int(run)):
            return
        last = SimpleNamespace(number=max(run.next_step - 1, run.first_step - 1), pk=None)
        ctx = SimpleNamespace(run=run, step=last, failure=None)
        end_ns = int(run.finished_at.timestamp() * 1e9) if run.finished_at else time_ns()
        cancelled: tuple = (("agentrun.cancelled", end_ns, {}),)
        t.emit([_root_span(ctx, "cancelled", "", end_ns, _trace_int(run), cancelled)])
    except Exception:
        log.exception("the root span of cancelled run %s failed", run.pk)


def _fork_link(run: Any) -> tuple[int, int, dict[str, Any]] | None:
    """The fork's link to the span of the step it was forked from: (trace, span, attributes)."""
    from agentrun.models import Run, Snapshot, Step

    snap = Snapshot.objects.filter(pk=run.forked_from_id).values("run_id", "step").first()
    parent = Run.objects.filter(pk=run.parent_id).only("id", "trace_parent").first()
    if snap is None or parent is None:
        return None
    attempts = (
        Step.objects.filter(run_id=snap["run_id"], number=snap["step"])
        .values_list("attempts", flat=True)
        .first()
    )
    if attempts is None:
        return None
    source = step_span_id(snap["run_id"], snap["step"], attempts)
    return (
        _trace_int(parent),
        source,
        {
            "agentrun.link": "forked_from",
            "agentrun.step.number": snap["step"],
        },
    )


# --- replay batches -----------------------------------------------------------------------


def batch_span_id(batch_id: Any) -> int:
    """The span id of a replay batch's span, the root of a trace whose id is the batch's."""
    return _span_int(batch_id, "batch")


def _batch_link(batch_id: Any, kind: str = "batch") -> tuple[int, int, dict[str, Any]]:
    return _trace_int(batch_id), batch_span_id(batch_id), {"agentrun.link": kind}


def emit_batch(batch_id: Any) -> None:
    """The span of a replay batch that ended (each fork judged, or cancelled): the root of a
    trace of its own, linked to its forks' root spans, each of which links back. Never
    raises: the batch's end is committed already."""
    try:
        t = tracer()
        if t is None or not t.sampled(_trace_int(batch_id)):
            return
        t.emit([_batch_span(batch_id)])
    except Exception:
        log.exception("the span of replay batch %s failed", batch_id)


def _batch_span(batch_id: Any) -> tuple[int, bytes]:
    from django.urls import reverse

    from agentrun.models import BatchItem, ReplayBatch

    batch = ReplayBatch.objects.select_related("created_by").get(pk=batch_id)
    items = BatchItem.objects.filter(batch=batch)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "replay_batch",
        "agentrun.batch.id": str(batch.pk),
        "agentrun.batch.name": bounded(batch.name),
        "agentrun.batch.mode": batch.mode,
        "agentrun.batch.status": batch.status,
        "agentrun.batch.url": settings.AGENTRUN_SITE_URL
        + reverse("debugger:batch-detail", kwargs={"batch_id": batch.pk}),
        "agentrun.batch.code_version": batch.version,
        "agentrun.batch.created_by": batch.created_by.get_username() if batch.created_by else "",
        **_batch_counts(items),
    }
    links = [_batch_link(batch.promoted_from_id, "promoted_from")] if batch.promoted_from_id else []
    if batch.promoted_from_id:
        attributes["agentrun.batch.promoted_from"] = str(batch.promoted_from_id)
    forks = _fork_links(items, len(links))
    attributes["agentrun.batch.runs_linked"] = len(forks)
    end_ns = int(batch.finished_at.timestamp() * 1e9) if batch.finished_at else time_ns()
    start_ns = min(int(batch.created_at.timestamp() * 1e9), end_ns)
    cancelled = batch.status == "cancelled"
    span_id = batch_span_id(batch.pk)
    data = otlp.span(
        _trace_int(batch.pk), span_id, 0, "invoke_workflow replay_batch", start_ns, end_ns,
        attributes, events=[("agentrun.cancelled", end_ns, {})] if cancelled else [],
        links=links + forks,
    )  # fmt: skip
    return span_id, data


def _batch_counts(items: Any) -> dict[str, int]:
    """A batch's items, forks and verdicts, counted (one query)."""
    from django.db.models import Count

    from agentrun.models import ItemStatus, Verdict

    verdicts = dict.fromkeys(Verdict.values, 0)
    total = runs = skipped = 0
    rows = items.values_list("status", "verdict").annotate(n=Count("pk")).order_by()
    for status, verdict, n in rows:
        total += n
        runs += n if status == ItemStatus.FORKED else 0
        skipped += n if status == ItemStatus.SKIPPED else 0
        if verdict:
            verdicts[verdict] = verdicts.get(verdict, 0) + n
    return {
        "agentrun.batch.items": total,
        "agentrun.batch.skipped": skipped,
        "agentrun.batch.runs": runs,
        # Forks without a verdict yet: those a cancelled batch made, still running.
        "agentrun.batch.running": runs - sum(verdicts.values()),
        **{f"agentrun.batch.verdict.{v}": n for v, n in verdicts.items()},
    }


def _fork_links(items: Any, taken: int) -> list[tuple[int, int, dict[str, Any]]]:
    """Links to the root spans of a batch's forks, in the batch's order: as many as
    OTEL_SPAN_LINK_COUNT_LIMIT (128) lets a span have, besides the `taken` ones."""
    from opentelemetry.sdk.trace import SpanLimits

    limit = SpanLimits().max_links
    rows = (
        items.filter(fork__isnull=False)
        .order_by("position")
        .values_list("fork_id", "fork__trace_parent", "verdict")
    )
    links = []
    for fork_id, trace_parent, verdict in rows if limit is None else rows[: max(limit - taken, 0)]:
        fork = SimpleNamespace(pk=fork_id, trace_parent=trace_parent)
        about = {"agentrun.link": "batch_run", "agentrun.run.id": str(fork_id)}
        links.append(
            (_trace_int(fork), root_span_id(fork_id), {**about, "agentrun.batch.verdict": verdict})
        )
    return links


# --- emitted again, from the rows ---------------------------------------------------------


def emit_lost(limit: int = 500) -> int:
    """Emit the spans of committed steps whose export is not on record, from their rows
    (the reconciler, every pass): a worker killed between a commit and its batch's export
    took them with it. Returns how many steps; their mark follows their export, here.

    A step is due AGENTRUN_TRACE_REEMIT_AFTER seconds after its commit (a live worker
    exports its own well before), and each pass that emits it claims it for as long again
    (concurrent passes emit each step once; a failed export is tried again then), for up to
    AGENTRUN_TRACE_REEMIT_WITHIN seconds after its commit. A worker killed after an export
    but before its mark has its spans sent twice, with the same ids: receivers keep one.
    """
    t = tracer()
    if t is None:
        return 0
    from django.utils import timezone

    from agentrun.models import Step, ToolCall

    now = timezone.now()
    after = timedelta(seconds=settings.AGENTRUN_TRACE_REEMIT_AFTER)
    due = Step.objects.filter(trace_due_at__isnull=False)
    # Too old to be worth a trace now: out of the index, never tried again.
    oldest = now - max(timedelta(seconds=settings.AGENTRUN_TRACE_REEMIT_WITHIN), after)
    due.filter(finished_at__lt=oldest).update(trace_due_at=None)
    steps = []
    for step in (
        due.filter(trace_due_at__lte=now).select_related("run").order_by("trace_due_at")[:limit]
    ):
        # Claimed by a compare-and-set: another pass that read it too finds it changed.
        claim = Step.objects.filter(pk=step.pk, trace_due_at=step.trace_due_at)
        if claim.update(trace_due_at=now + after):
            steps.append(step)
    if not steps:
        return 0
    calls: dict[int, list[Any]] = {}
    for tc in ToolCall.objects.filter(step__in=[s.pk for s in steps]).order_by("index"):
        calls.setdefault(tc.step_id, []).append(tc)
    for step in steps:
        try:
            emit_step(*_attempt_of(step, calls.get(step.pk, [])))
        except Exception:  # one odd row must not keep the others from their traces
            log.exception(
                "emitting the spans of step %s of run %s failed", step.number, step.run_id
            )
    flush()  # exported (and marked) before the next pass looks again
    log.info("emitted the spans of %d committed step(s) again", len(steps))
    return len(steps)


def _attempt_of(step: Any, calls: list[Any]) -> tuple[Any, str, str, int, int]:
    """A committed step's last attempt, as `emit_step` takes it, from its rows."""
    run = step.run
    end_ns = int(step.finished_at.timestamp() * 1e9)
    start_ns = end_ns - int((step.duration_ms or 0) * 1e6)
    detail = ""
    last = step.number == run.next_step - 1 and run.status in ("succeeded", "failed")
    if step.status == "failed":
        outcome = "failed"
        detail = str((step.failure or {}).get("message") or run.error)
    elif last and run.status == "failed":  # a limit ended the run after this step
        outcome, detail = "failed", run.error
    else:
        outcome = "finished" if last else "committed"
    decision = step.decision or {}
    llm = decision.get("llm") if isinstance(decision.get("llm"), dict) else None
    window = None
    if llm and step.decided_at and step.decided_at.timestamp() * 1e9 >= start_ns:
        decided_ns = int(step.decided_at.timestamp() * 1e9)  # asked in this attempt
        window = (decided_ns - int((step.llm_latency_ms or 0) * 1e6), decided_ns)
    call_ids = [
        c.get("call_id") if isinstance(c, dict) else None for c in decision.get("calls") or []
    ]
    acted = []
    for tc in calls:
        before = sum(1 for a in tc.attempts or [] if _at_ns(a) < start_ns)
        acted.append((tc, call_ids[tc.index] if tc.index < len(call_ids) else None, before))
    ctx = SimpleNamespace(
        run=run,
        step=step,
        owner=step.worker,
        failure=step.failure,
        reemitted=True,
        decision=SimpleNamespace(llm=llm),
        llm_window=window,
        acted=acted,
    )
    return ctx, outcome, detail, start_ns, end_ns


def _at_ns(attempt: Any) -> int:
    try:
        return int(datetime.fromisoformat(attempt["at"]).timestamp() * 1e9)
    except (KeyError, TypeError, ValueError):
        return 0
