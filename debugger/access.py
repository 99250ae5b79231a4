"""Who may see and do what in the debugger: one place for every access check.

Every page needs a logged-in user with a role (viewer, operator or admin);
a user without one gets 403 everywhere. Mutations need `operate`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, Literal
from uuid import UUID

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404

from agentrun.models import ReplayBatch, Run
from agentrun.security.roles import ROLES, role_of

Perm = Literal["view", "operate"]

# Run output is untrusted: no inline script may ever execute, htmx may only talk to us.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "object-src 'none'",
    ]
)


def role(request: HttpRequest) -> str | None:
    """The user's role, looked up once per request (a page asks several times)."""
    if not hasattr(request, "_debugger_role"):
        request._debugger_role = role_of(request.user)  # type: ignore[attr-defined]
    return request._debugger_role  # type: ignore[attr-defined]


def _may(request: HttpRequest, perm: Perm) -> bool:
    # As agentrun.security.roles.can_view / can_operate, from the role already looked up.
    return role(request) in (("operator", "admin") if perm == "operate" else ROLES)


def check(request: HttpRequest, perm: Perm = "view") -> None:
    """Raise PermissionDenied unless the logged-in user may `perm`."""
    if not _may(request, perm):
        raise PermissionDenied(f"{perm} needs a role that allows it")


def role_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Login, then any role; every debugger response also gets the CSP header."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        check(request, "view")
        response = view(request, *args, **kwargs)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return wrapper


def get_run_for(request: HttpRequest, run_id: Any, perm: Perm = "view") -> Run:
    """The run, if the user may `perm` it: 403 without the role, 404 when unknown."""
    check(request, perm)
    return get_object_or_404(Run, pk=parse_uuid(run_id))


def get_batch_for(request: HttpRequest, batch_id: Any, perm: Perm = "view") -> ReplayBatch:
    """The replay batch, if the user may `perm` it: 403 without the role, 404 when unknown."""
    check(request, perm)
    batches = ReplayBatch.objects.select_related("created_by", "promoted_from")
    return get_object_or_404(batches, pk=parse_uuid(batch_id))


def parse_uuid(value: Any) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise Http404("not a run id") from None


def abilities(request: HttpRequest) -> dict[str, Any]:
    """Template flags: what the current user's role allows."""
    return {"role": role(request), "can_operate": _may(request, "operate")}
