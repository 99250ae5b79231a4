"""The web's /metrics, for Prometheus: the database's view of runs, steps and workers."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agentrun.telemetry.metrics import WEB_REGISTRY


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.AGENTRUN_METRICS_TOKEN
    if not token:
        raise Http404("metrics are off: set AGENTRUN_METRICS_TOKEN")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        response = HttpResponse("a bearer token is needed\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(WEB_REGISTRY), content_type=CONTENT_TYPE_LATEST)
