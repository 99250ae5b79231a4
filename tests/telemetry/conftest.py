# Real workers and the named people's clients, as the runtime's and dashboard's tests have them.
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from agentrun.telemetry import tracing
from tests.agentrun.conftest import people, start_worker  # noqa: F401
from tests.debugger.conftest import client_for  # noqa: F401
from tests.telemetry.otlp import Kept


@pytest.fixture
def exported(monkeypatch):
    """Spans this process emits, exported at once (the SDK's simple processor) and kept."""
    kept = Kept()
    processor = SimpleSpanProcessor(tracing.Exporter(kept.send, {"service.name": "test"}))
    exporting = tracing.Exporting(TracerProvider().sampler, processor)
    monkeypatch.setattr(tracing, "_STATE", {"tracer": exporting})
    return kept
