"""The JSON API under /api/ (DESIGN section 6; described by agentrun.openapi).

Small function views behind one decorator, `api_view`, which authenticates
(the session, or `Authorization: Bearer TOKEN`), checks the role, enforces
CSRF for session-authenticated POSTs and turns every error into JSON
`{"detail": "..."}`. The views call agentrun.services and render.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from agentrun import inflight, services, snapshots
from agentrun.agents import InvalidInput
from agentrun.models import (
    ApiToken,
    LedgerEntry,
    LedgerInvocation,
    Run,
    RunStatus,
    Snapshot,
    Step,
    ToolCall,
)
from agentrun.openapi import document
from agentrun.roles import can_operate, role_of
from agentrun.storable import check_storable

log = logging.getLogger(__name__)

View = Callable[..., HttpResponse]

MAX_LIMIT = 500
DEFAULT_LIMIT = 50
MAX_OFFSET = 10**9  # beyond it the database's integers overflow long before any page exists
# Writing last_used_at on every request would turn each read into a write.
TOKEN_TOUCH_EVERY = timedelta(minutes=1)


class ApiError(Exception):
    """An error answer: `detail`, plus `extra` members of the JSON body (e.g. `field`)."""

    def __init__(self, status: int, detail: str, **extra: Any):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra


def _error(status: int, detail: str, extra: dict[str, Any] | None = None) -> JsonResponse:
    response = JsonResponse({"detail": detail, **(extra or {})}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="agentrun"'
    return response


# --- authentication and access ------------------------------------------------


def _token_user(header: str) -> Any:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401, "unsupported Authorization header; send `Authorization: Bearer <token>`"
        )
    found = (
        ApiToken.objects.select_related("user")
        .filter(digest=ApiToken.digest_of(token.strip()))
        .first()
    )
    if found is None or not found.user.is_active:
        raise ApiError(401, "invalid API token")
    now = timezone.now()
    if found.last_used_at is None or now - found.last_used_at > TOKEN_TOUCH_EVERY:
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found.user


class _CsrfCheck(CsrfViewMiddleware):
    # Hand back Django's reason ("CSRF token missing." ...) instead of its HTML page.
    def _reject(self, request: HttpRequest, reason: str) -> str:  # type: ignore[override]
        return reason


def _nothing(request: HttpRequest) -> HttpResponse:
    return HttpResponse()


def _check_csrf(request: HttpRequest) -> None:
    reason = _CsrfCheck(_nothing).process_view(request, _nothing, (), {})
    if reason:
        raise ApiError(
            403,
            f"CSRF check failed: {reason} A session-authenticated POST needs the csrftoken "
            "cookie's value in an X-CSRFToken header; API clients should use a Bearer token.",
        )


def _authorize(request: HttpRequest) -> None:
    """Who is calling, and may they? Sets request.user or raises ApiError."""
    header = request.headers.get("Authorization", "")
    if header:
        request.user = _token_user(header)
    elif not request.user.is_authenticated:
        raise ApiError(
            401, "authentication required: log in, or send `Authorization: Bearer <token>`"
        )
    elif request.method == "POST":
        _check_csrf(request)  # a Bearer token can't be sent by another site's form; a cookie can
    role = role_of(request.user)
    if role is None:
        raise ApiError(
            403, f"user {request.user.get_username()!r} has no role; ask an admin for one"
        )
    if request.method == "POST" and not can_operate(request.user):
        raise ApiError(
            403, f"this action needs the operator role; {request.user.get_username()!r} is a {role}"
        )


def api_view(*methods: str) -> Callable[[View], View]:
    """Allow `methods`, authenticate and authorize, answer every error in JSON.

    Every POST is an operator action; every GET needs any role.
    """

    def decorate(view: View) -> View:
        @csrf_exempt  # checked in _authorize, for session-authenticated requests only
        @wraps(view)
        def wrapper(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = _error(
                    405, f"method {request.method} not allowed; use {' or '.join(methods)}"
                )
                response["Allow"] = ", ".join(methods)
                return response
            try:
                _authorize(request)
                return view(request, **kwargs)
            except ApiError as exc:
                return _error(exc.status, exc.detail, exc.extra)
            except RequestDataTooBig:
                limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
                return _error(413, f"request body too large: the limit is {limit} bytes")
            except SuspiciousOperation as exc:
                return _error(400, f"bad request: {exc}")
            except Exception:
                log.exception("API error on %s %s", request.method, request.path)
                return _error(500, "internal error; it has been logged")

        return wrapper

    return decorate


def _get_run(run_id: str) -> Run:
    """The run with this id, or a JSON 404 (an invalid UUID is simply not found)."""
    try:
        pk = uuid.UUID(run_id)
    except ValueError:
        raise ApiError(404, f"no run {run_id!r}: not a valid run id (a UUID)") from None
    run = Run.objects.select_related("created_by", "forked_from").filter(pk=pk).first()
    if run is None:
        raise ApiError(404, f"no run {run_id}")
    return run


# --- request bodies and parameters ----------------------------------------------


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {text[:50]}")
    return value


def _integer(text: str) -> int:
    if len(text) > 100:
        raise ValueError(f"integer too long ({len(text)} digits)")
    return int(text)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def parse_json(raw: str | bytes) -> Any:
    """Strict JSON: no NaN/Infinity, nothing the database would refuse. Raises ValueError."""
    try:
        value = json.loads(
            raw, parse_float=_finite, parse_int=_integer, parse_constant=_no_constants
        )
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # also UnicodeDecodeError, and what the hooks above raise
        raise ValueError(f"not valid JSON: {exc}") from None
    check_storable(value)
    return value


_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    dict: "a JSON object",
    int: "an integer",
    bool: "true or false",
    type(None): "null",
}

Kind = type | tuple[type, ...]


def _is_a(value: Any, kind: Kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):  # JSON true is no integer, though Python's bool is an int
        return bool in kinds
    return isinstance(value, kinds)


def _type_name(kind: Kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_TYPE_NAMES[k] for k in kinds)


def _body(request: HttpRequest, fields: dict[str, Kind]) -> dict[str, Any]:
    """The JSON object in the body, with only `fields`, each of the given type(s)."""
    raw = request.body  # raises RequestDataTooBig past DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        body = parse_json(raw) if raw.strip() else {}
    except ValueError as exc:
        raise ApiError(400, f"request body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ApiError(
            400, f"unknown field(s): {', '.join(unknown)} (expected: {', '.join(fields)})"
        )
    for name, kind in fields.items():
        if name in body and not _is_a(body[name], kind):
            raise ApiError(400, f"{name} must be {_type_name(kind)}", field=name)
    return body


def _text_param(request: HttpRequest, name: str) -> str:
    value = request.GET.get(name, "")
    try:
        check_storable(value, name)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return value


def _int_param(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    raw = _text_param(request, name)
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}, not {value}")
    return value


# --- rendering --------------------------------------------------------------------


def summary_json(run: Run) -> dict[str, Any]:
    snap = run.forked_from
    return {
        "id": str(run.pk),
        "agent": run.agent,
        "agent_version": run.agent_version,
        "status": run.status,
        "wait_reason": run.wait_reason,
        "phase": run.phase,
        "parent_id": str(run.parent_id) if run.parent_id else None,
        "forked_from": {"step": snap.step, "at": snap.at} if snap else None,
        "mode": run.mode,
        "divergence_step": run.divergence_step,
        "first_step": run.first_step,
        "created_by": run.created_by.get_username() if run.created_by else None,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "next_step": run.next_step,
        "error": run.error,
        "final_answer": run.final_answer,
        "tokens_in": run.tokens_in,
        "tokens_out": run.tokens_out,
    }


def _tool_call(tc: ToolCall) -> dict[str, Any]:
    return {
        "index": tc.index,
        "tool": tc.tool,
        "kind": tc.kind,
        "status": tc.status,
        "idempotency_key": tc.idempotency_key,
        "attempts": tc.attempts,
        "args": tc.args,
        "result": tc.result,
        "error": tc.error,
        "approval": tc.approval,
        "compensation": tc.compensation,
    }


def _step(step: Step) -> dict[str, Any]:
    return {
        "number": step.number,
        "status": step.status,
        "attempts": step.attempts,
        "phase_before": step.phase_before,
        "phase_after": step.phase_after,
        "thought": step.thought,
        "rationale": step.rationale,
        "decision_count": step.decision_count,
        "failure": step.failure,
        "duration_ms": step.duration_ms,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "tool_calls": [_tool_call(tc) for tc in step.tool_calls.all()],
    }


def detail_json(run: Run) -> dict[str, Any]:
    steps = run.steps.order_by("number").prefetch_related(
        Prefetch("tool_calls", queryset=ToolCall.objects.order_by("index"))
    )
    return {**summary_json(run), "steps": [_step(s) for s in steps]}


# --- views ----------------------------------------------------------------------------


@api_view("GET", "POST")
def runs(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return _create_run(request)
    status = _text_param(request, "status")
    if status and status not in RunStatus.values:
        raise ApiError(400, f"unknown status {status!r} (known: {', '.join(RunStatus.values)})")
    limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    offset = _int_param(request, "offset", 0, 0, MAX_OFFSET)
    qs = Run.objects.all()
    if status:
        qs = qs.filter(status=status)
    if agent := _text_param(request, "agent"):
        qs = qs.filter(agent=agent)
    page = qs.select_related("created_by", "forked_from").order_by("-created_at", "-id")
    items = [summary_json(r) for r in page[offset : offset + limit]]
    return JsonResponse({"items": items, "count": qs.count()})


def _create_run(request: HttpRequest) -> HttpResponse:
    body = _body(request, {"agent": str, "input": dict})
    if "agent" not in body:
        raise ApiError(400, "agent is required")
    if "input" not in body:
        raise ApiError(400, "input is required (a JSON object)")
    try:
        run = services.start_run(body["agent"], body["input"], user=request.user)
    except InvalidInput as exc:
        raise ApiError(400, str(exc)) from None
    return JsonResponse(summary_json(run), status=201)


@api_view("GET")
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    return JsonResponse(detail_json(_get_run(run_id)))


@api_view("GET")
def run_snapshot(request: HttpRequest, run_id: str, step: str, at: str) -> HttpResponse:
    run = _get_run(run_id)
    if at not in ("pre", "post"):
        raise ApiError(404, f"no snapshot {at!r}: it is pre or post")
    if not re.fullmatch(r"[0-9]{1,9}", step):
        raise ApiError(404, f"no snapshot at step {step!r}: a step is a number")
    try:
        snap = snapshots.get(run.pk, int(step), at)
    except Snapshot.DoesNotExist:
        raise ApiError(404, f"run {run.pk} has no {at} snapshot of step {step}") from None
    return JsonResponse(
        {"step": snap.step, "at": snap.at, "hash": snap.hash, "state": snap.state()}
    )


@api_view("POST")
def run_cancel(request: HttpRequest, run_id: str) -> HttpResponse:
    return _with_reason(request, run_id, services.cancel_run)


@api_view("POST")
def run_retry(request: HttpRequest, run_id: str) -> HttpResponse:
    return _with_reason(request, run_id, services.retry_crashed_step)


def _with_reason(request: HttpRequest, run_id: str, action: Any) -> HttpResponse:
    """An operator's action on a run that takes only a reason; 409 if it doesn't apply."""
    run = _get_run(run_id)
    body = _body(request, {"reason": str})
    try:
        action(run, user=request.user, reason=body.get("reason", ""))
    except services.ActionError as exc:
        raise ApiError(409, str(exc)) from None
    return JsonResponse(detail_json(_get_run(run_id)))


@api_view("POST")
def run_approve(request: HttpRequest, run_id: str) -> HttpResponse:
    run = _get_run(run_id)
    body = _body(request, {"decision": str, "comment": str, "resolution": str})
    if body.get("decision") not in ("approve", "reject"):
        raise ApiError(400, 'decision must be "approve" or "reject"')
    if body.get("resolution") not in (None, "retry", "mark_done"):
        raise ApiError(400, 'resolution must be "retry" or "mark_done"')
    try:
        services.decide_approval(
            run,
            user=request.user,
            decision=body["decision"],
            comment=body.get("comment", ""),
            resolution=body.get("resolution"),
        )
    except services.ActionError as exc:
        raise ApiError(409, str(exc)) from None
    return JsonResponse(detail_json(_get_run(run_id)))


# --- forks ------------------------------------------------------------------------------

#: A fork point beyond this is out of range (snapshot positions are 32-bit integers).
MAX_STEP = 10**9
FORK_FIELDS: dict[str, Kind] = {
    "step": int,
    "at": str,
    "state": (dict, type(None)),
    "mode": str,
    "reason": str,
    "confirm_live": bool,
}


def _side_effect(tc: ToolCall) -> dict[str, Any]:
    return {
        "step": tc.step.number,
        "index": tc.index,
        "tool": tc.tool,
        "kind": tc.kind,
        "status": tc.status,
        "args": tc.args,
        "idempotency_key": tc.idempotency_key,
        "compensation": tc.compensation,
    }


def _check_step(step: int) -> None:
    if not -MAX_STEP <= step <= MAX_STEP:
        raise ApiError(
            400, f"step {step} is out of range: no run has that many steps", field="step"
        )


@api_view("POST")
def run_fork(request: HttpRequest, run_id: str) -> HttpResponse:
    """Start a new run from a snapshot of this one (DESIGN section 6, replay modes)."""
    run = _get_run(run_id)
    body = _body(request, FORK_FIELDS)
    if "step" not in body:
        raise ApiError(400, "step is required: the step whose snapshot to fork from", field="step")
    _check_step(body["step"])
    at = body.get("at", "pre")
    try:
        fork = services.fork_run(
            run,
            step=body["step"],
            at=at,
            state=body.get("state"),
            mode=body.get("mode", "sandbox"),
            reason=body.get("reason", ""),
            user=request.user,
            confirm_live=body.get("confirm_live", False),
        )
    except services.ForkError as exc:
        if exc.field != "confirm_live":
            raise ApiError(400, str(exc), field=exc.field) from None
        effects = services.side_effects_after(run, body["step"], at)
        raise ApiError(
            400,
            f"{exc}: send confirm_live: true to run the parent's {len(effects)} write/hybrid "
            "call(s) after this point again, with the fork's own idempotency keys "
            "(listed in side_effects)",
            field="confirm_live",
            side_effects=[_side_effect(tc) for tc in effects],
        ) from None
    except InvalidInput as exc:  # the parent's agent is not registered in this deployment
        raise ApiError(409, f"can't fork this run: {exc}") from None
    response = JsonResponse(detail_json(_get_run(str(fork.pk))), status=201)
    response["Location"] = f"/api/runs/{fork.pk}"
    return response


@api_view("GET")
def run_side_effects(request: HttpRequest, run_id: str) -> HttpResponse:
    """The parent's write/hybrid calls a live fork from (step, at) would run again."""
    run = _get_run(run_id)
    if _text_param(request, "step") == "":
        raise ApiError(
            400,
            "the step parameter is required: side-effects?step=<n>&at=pre|post",
            field="step",
        )
    step = _int_param(request, "step", 0, -MAX_STEP, MAX_STEP)
    at = _text_param(request, "at") or "pre"
    if at not in ("pre", "post"):
        raise ApiError(400, f'at must be "pre" or "post", not {at!r}', field="at")
    if not Snapshot.objects.filter(run=run, seq=Snapshot.seq_for(step, at)).exists():
        last = run.steps.order_by("-number").values_list("number", flat=True).first()
        known = f"steps {run.first_step}..{last}" if last else "no steps yet"
        raise ApiError(400, f"run has no {at} snapshot of step {step} ({known})", field="step")
    effects = services.side_effects_after(run, step, at)
    return JsonResponse(
        {
            "run_id": str(run.pk),
            "step": step,
            "at": at,
            "confirm_live_required": bool(effects),
            "side_effects": [_side_effect(tc) for tc in effects],
        }
    )


@api_view("GET")
def ledger(request: HttpRequest) -> HttpResponse:
    run_id = _text_param(request, "run")
    if not run_id:
        raise ApiError(400, "the run parameter is required: /api/ledger?run=<run id>")
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise ApiError(400, f"run must be a run id (a UUID), not {run_id!r}") from None
    run = _get_run(run_id)
    entries = LedgerEntry.objects.filter(run=run).order_by("created_at", "pk")
    invocations = LedgerInvocation.objects.filter(run=run).order_by("idempotency_key")
    return JsonResponse(
        {
            "entries": [
                {
                    "idempotency_key": e.idempotency_key,
                    "account": e.account,
                    "amount": str(e.amount),
                    "created_at": e.created_at,
                }
                for e in entries
            ],
            "invocations": {i.idempotency_key: i.count for i in invocations},
        }
    )


@api_view("GET")
def in_flight(request: HttpRequest) -> HttpResponse:
    """What the Now page shows: every active run's current step, by state and worker."""
    state = _text_param(request, "state")
    if state and state not in inflight.BY_KEY:
        raise ApiError(
            400, f"unknown state {state!r} (known: {', '.join(inflight.BY_KEY)})", field="state"
        )
    worker = _text_param(request, "worker")
    limit = _int_param(request, "limit", inflight.LIMIT, 1, inflight.MAX_LIMIT)
    return JsonResponse(inflight_json(inflight.snapshot(worker=worker, state=state, limit=limit)))


def inflight_json(snap: inflight.InFlight) -> dict[str, Any]:
    return {
        "now": snap.now,
        "total": snap.total,
        "in_flight": snap.in_flight,
        "counts": snap.counts,
        "workers": [
            {
                "worker": row.worker or None,
                "counts": {s.key: n for s, n in row.cells},
                "total": row.total,
            }
            for row in snap.workers
        ],
        "filter": {"state": snap.state, "worker": snap.worker, "limit": snap.limit},
        "groups": [
            {
                "state": g.state.key,
                "title": g.state.title,
                "count": g.count,
                "more": g.more,
                "items": [_inflight_item(i) for i in g.items],
            }
            for g in snap.groups
        ],
    }


def _inflight_item(item: inflight.Item) -> dict[str, Any]:
    call = item.call
    return {
        "run_id": str(item.run_id),
        "agent": item.agent,
        "state": item.state,
        "worker": item.worker or None,
        "lease_owner": item.lease_owner or None,
        "step": item.step,
        "attempt": item.attempt,
        "since": item.since,
        "waited_s": round(item.waited_s, 3),
        "tools": list(item.tools),
        "wake_at": item.wake_at,
        "wake_in_s": None if item.wake_in_s is None else round(item.wake_in_s, 3),
        "call": None
        if call is None
        else {
            "index": call.index,
            "tool": call.tool,
            "kind": call.kind,
            "status": call.status,
            "attempt": call.attempt,
            "running": call.running,
            "error": call.error,
            "attempt_at": call.attempt_at,
        },
    }


@csrf_exempt
def openapi_json(request: HttpRequest) -> HttpResponse:
    """Public: the API's description holds nothing a caller can't learn from a 401."""
    if request.method not in ("GET", "HEAD"):
        response = _error(405, f"method {request.method} not allowed; use GET")
        response["Allow"] = "GET"
        return response
    return JsonResponse(document())
