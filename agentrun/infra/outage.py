"""A database that is down or restarting answers 503, not 500.

While PostgreSQL restarts (or the network to it is cut), a query fails with Django's
OperationalError or InterfaceError. That is no bug of the page or the API call, and the
same request will work once the database is back: the answer says so, a 503 with
Retry-After and a plain message (JSON for the API, a page for the dashboard), never a
traceback. A pooled connection the server closed is found before it is used (the pool
checks each connection it hands out, see agentrun.settings), so a restart that is over
costs no request an error.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views import defaults

log = logging.getLogger(__name__)

#: Seconds a client is asked to wait before it tries again.
RETRY_AFTER = 5
MESSAGE = "The database is unavailable (restarting or unreachable); try again in a few seconds."
UNAVAILABLE = (OperationalError, InterfaceError)


def unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    """The 503 answer to `request`, whose query failed with `exc`."""
    log.warning("database unavailable on %s %s: %s", request.method, request.path, exc)
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": MESSAGE}, status=503)
    else:
        # Rendered without the request: its context (the user, the session) would ask
        # the database again.
        response = HttpResponse(render_to_string("503.html", {"message": MESSAGE}), status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseUnavailableMiddleware:
    """A view (or its template) that met a database that is down answers 503."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        return unavailable(request, exc) if isinstance(exc, UNAVAILABLE) else None


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 handler, for what failed outside a view (a middleware's query): a
    database that is down is a 503 there too."""
    exc = sys.exc_info()[1]
    if isinstance(exc, UNAVAILABLE):
        return unavailable(request, exc)
    return defaults.server_error(request)
