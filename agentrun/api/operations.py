"""The JSON API under /api/ (DESIGN section 6), declared once with Django Ninja.

Each operation is a small function typed with the models of agentrun.api.schemas:
Ninja validates the request and renders the response through them, and the
OpenAPI document at /api/openapi.json is generated from the same declarations.
Around that, `Api` keeps the API's conventions: every error is JSON
`{"detail": "..."}` (with `field` naming the member at fault); the session or
`Authorization: Bearer TOKEN` authenticates; any role may read, every POST needs
an operator (and, from a session, the CSRF token). The views call
agentrun.lifecycle.services and render.
"""

from __future__ import annotations

import tempfile
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any

from django.conf import settings
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from ninja import Path, Query, Status
from ninja.security import APIKeyCookie, HttpBearer
from pydantic import StringConstraints

from agentrun.agents import InvalidInput
from agentrun.api import schemas as s
from agentrun.api.base import Api, ApiError
from agentrun.audit import chain
from agentrun.audit import export as audit_export
from agentrun.builtin import llm_requests
from agentrun.engine import inflight, versions
from agentrun.lifecycle import archive, batches, retention, selection, services
from agentrun.lifecycle import labels as run_labels
from agentrun.models import (
    ApiToken,
    BatchItem,
    LedgerEntry,
    LedgerInvocation,
    ReplayBatch,
    Run,
    Snapshot,
    Step,
    StepStatus,
    ToolCall,
    ToolCallStatus,
)
from agentrun.security.redact import redact
from agentrun.security.roles import can_operate, role_of
from agentrun.security.storable import TEXT_PATTERN, parse_json
from agentrun.store import search, snapshots, watch

MAX_LIMIT = 500
DEFAULT_LIMIT = 50
MAX_OFFSET = 10**9  # beyond it the database's integers overflow long before any page exists
MAX_STEP = s.MAX_STEP
# A run's steps per page of GET /runs/{id}: the default covers a usual run whole.
STEPS_DEFAULT_LIMIT = 200
STEPS_MAX_LIMIT = 1000
FORK_FIELDS = s.FORK_FIELDS
# Writing last_used_at on every request would turn each read into a write.
TOKEN_TOUCH_EVERY = timedelta(minutes=1)


# --- who is calling -------------------------------------------------------------------------


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


def _admit(request: HttpRequest) -> Any:
    """request.user may do this (any role reads; every POST is an operator's), or ApiError."""
    role = role_of(request.user)
    if role is None:
        raise ApiError(
            403, f"user {request.user.get_username()!r} has no role; ask an admin for one"
        )
    if request.method == "POST" and not can_operate(request.user):
        raise ApiError(
            403, f"this action needs the operator role; {request.user.get_username()!r} is a {role}"
        )
    return request.user


class BearerToken(HttpBearer):
    """`Authorization: Bearer TOKEN` (manage.py apitoken). A bad header is a 401 even
    with a session: the caller meant the token."""

    scheme_name = "bearerAuth"

    def __call__(self, request: HttpRequest) -> Any:
        header = request.headers.get("Authorization", "")
        if not header:
            return None  # perhaps a session
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401, "unsupported Authorization header; send `Authorization: Bearer <token>`"
            )
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = (
            ApiToken.objects.select_related("user").filter(digest=ApiToken.digest_of(token)).first()
        )
        if found is None or not found.user.is_active:
            raise ApiError(401, "invalid API token")
        now = timezone.now()
        if found.last_used_at is None or now - found.last_used_at > TOKEN_TOUCH_EVERY:
            ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
        request.user = found.user
        return _admit(request)


class SessionCookie(APIKeyCookie):
    """The debugger's login session. A POST must carry the CSRF token: a Bearer token
    can't be sent by another site's form; a cookie can."""

    scheme_name = "sessionAuth"
    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self) -> None:
        super().__init__(csrf=False)  # checked below, with a message that says what to send

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        if not request.user.is_authenticated:
            return None
        if request.method == "POST":
            _check_csrf(request)
        return _admit(request)


api = Api(
    title="agentrun",
    version="1",
    description=(
        'Durable LLM agent runs. Every error is JSON `{"detail": "..."}`. '
        "Authenticate with a Bearer token (`manage.py apitoken NAME`) or a session; "
        "session-authenticated POSTs need the csrftoken cookie's value in X-CSRFToken. "
        "Reading needs any role; every POST needs the operator role."
    ),
    auth=[BearerToken(), SessionCookie()],
    prefix="/api/",
    parse=parse_json,
)


def _get_run(run_id: uuid.UUID | str) -> Run:
    run = (
        Run.objects.select_related("created_by", "forked_from", "pinned_by")
        .prefetch_related("labels")
        .filter(pk=run_id)
        .first()
    )
    if run is None:
        raise ApiError(404, f"no run {run_id}")
    return run


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
        "tokens_cached": run.tokens_cached,
        "cost_usd": run.cost_usd,
        "labels": run_labels.of(run),
        **retention_json(run),
        "imported_at": run.imported_at,
        "created_version": run.created_version,
        "target_version": run.target_version,
        "code_version": run.code_version,
        "waiting_for_version": waiting_for_version(run),
        "batch_id": str(run.batch_id) if run.batch_id else None,
    }


def waiting_for_version(run: Run) -> bool:
    return (
        bool(run.target_version)
        and run.is_active
        and (run.target_version not in versions.versions_alive())
    )


def retention_json(run: Run) -> dict[str, Any]:
    """The run's pin and when retention purges it."""
    pin = None
    if run.pinned_at is not None:
        by = run.pinned_by.get_username() if run.pinned_by else None
        pin = {"at": run.pinned_at, "by": by, "reason": run.pin_reason}
    return {"pin": pin, "purged_at": run.purged_at, "purge_after": retention.purge_after(run)}


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
        "worker": step.worker,
        "code_version": step.code_version,
        "tokens_in": step.tokens_in,
        "tokens_out": step.tokens_out,
        "tokens_cached": step.tokens_cached,
        "cost_usd": step.cost_usd,
        "tool_calls": [_tool_call(tc) for tc in step.tool_calls.all()],
    }


def detail_json(run: Run, steps_offset: int = 0, steps_limit: int | None = None) -> dict[str, Any]:
    """The run with one page of its steps (in order), and where the next page starts."""
    limit = STEPS_DEFAULT_LIMIT if steps_limit is None else steps_limit
    steps = run.steps.order_by("number").prefetch_related(
        Prefetch("tool_calls", queryset=ToolCall.objects.order_by("index"))
    )[steps_offset : steps_offset + limit]
    page = [_step(s) for s in steps]
    short = len(page) < limit and (page or not steps_offset)  # the last page: no count needed
    total = steps_offset + len(page) if short else run.steps.count()
    following = steps_offset + len(page)
    kept_by = retention.kept_by(run) if run.pinned_at is None and run.purged_at is None else None
    return {
        **summary_json(run),
        "input": redact(run.input),
        "steps": page,
        "steps_total": total,
        "steps_offset": steps_offset,
        "steps_limit": limit,
        "steps_next_offset": following if following < total else None,
        "kept_by": str(kept_by.pk) if kept_by else None,
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


# --- operations ----------------------------------------------------------------------------

RunId = Annotated[uuid.UUID, Path(description="The run's id, a UUID.")]


def _errors(*codes: int) -> dict[frozenset[int], type[s.Error]]:
    return {frozenset(codes): s.Error}


@api.get("/runs", response={200: s.RunList, **_errors(400, 401, 403)}, summary="Runs, newest first")
def list_runs(
    request: HttpRequest,
    status: Annotated[
        s.RunStatusName | None, Query(description="Only runs with this status.")
    ] = None,  # type: ignore[valid-type]
    agent: Annotated[
        str,
        Query(
            max_length=s.AGENT_MAX_LENGTH,
            pattern=TEXT_PATTERN,
            description="Only runs of this agent.",
        ),
    ] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Runs to skip.")] = 0,
    label: Annotated[
        list[
            Annotated[
                str,
                StringConstraints(
                    pattern=run_labels.FILTER_PATTERN, max_length=run_labels.FILTER_MAX_LENGTH
                ),
            ]
        ],
        Query(
            description="Only runs with this label: `key=value`, or a bare word: a key (any "
            "value) or a value (any key). "
            "Repeat it for runs with all of them."
        ),
    ] = [],  # noqa: B006 -- Ninja copies the default
    pinned: Annotated[
        bool | None, Query(description="true: only pinned runs; false: only unpinned ones.")
    ] = None,
    q: Annotated[
        str,
        Query(
            max_length=selection.TEXT_MAX_LENGTH,
            pattern=TEXT_PATTERN,
            description="A run id or its start, or text in the input or a label.",
        ),
    ] = "",
    error: Annotated[
        str,
        Query(
            max_length=selection.TEXT_MAX_LENGTH,
            pattern=TEXT_PATTERN,
            description="Text in the run's error.",
        ),
    ] = "",
    version: Annotated[
        s.Version | None,
        Query(description="Only runs whose latest step ran on this code version."),
    ] = None,
    tool_failed: Annotated[
        str,
        Query(
            max_length=100,
            pattern=TEXT_PATTERN,
            description="Only runs where a call to this tool failed.",
        ),
    ] = "",
    since: Annotated[
        datetime | None,
        Query(description="Created at or after this date and time (or a date: its start)."),
    ] = None,
    until: Annotated[
        datetime | None,
        Query(description="Created before this date and time (or a date: its end)."),
    ] = None,
    repeated: Annotated[
        int | None,
        Query(
            ge=1,
            le=selection.MAX_HOURS,
            description="Failing repeatedly: runs that failed in this many hours with an error "
            f"at least {selection.REPEATED_RUNS} of them share.",
        ),
    ] = None,
    stuck: Annotated[
        int | None,
        Query(
            ge=1,
            le=selection.MAX_MINUTES,
            description="Runs not ended and unchanged for this many minutes.",
        ),
    ] = None,
    no_worker: Annotated[
        bool | None,
        Query(description="true: runs due to run now that no worker holds; false: the others."),
    ] = None,
) -> dict[str, Any]:
    given = {
        "repeated": repeated,
        "stuck": stuck,
        "no_worker": no_worker,
        "status": status,
        "agent": agent,
        "label": label,
        "pinned": pinned,
        "q": q,
        "error": error,
        "version": version,
        "tool_failed": tool_failed,
        # As given: a date alone means the whole day (selection).
        "since": request.GET.get("since") if since else None,
        "until": request.GET.get("until") if until else None,
    }
    try:
        chosen = selection.parse({k: v for k, v in given.items() if v not in (None, "", [])})
    except selection.SelectionError as exc:
        raise ApiError(400, str(exc), field=exc.field) from None
    qs = chosen.apply(Run.objects.all())
    page = (
        qs.select_related("created_by", "forked_from", "pinned_by")
        .prefetch_related("labels")
        .order_by("-created_at", "-id")
    )
    return {"items": [summary_json(r) for r in page[offset : offset + limit]], "count": qs.count()}


@api.post(
    "/runs",
    response={201: s.RunSummary, **_errors(400, 401, 403, 413)},
    summary="Start a run (operators)",
)
def start_run(request: HttpRequest, body: s.CreateRun) -> Status[dict[str, Any]]:
    try:
        run = services.start_run(
            body.agent,
            body.input,
            user=request.user,
            labels=body.labels,
            # Started inside a traced request (W3C Trace Context): the run joins its trace.
            trace_parent=request.headers.get("traceparent", ""),
        )
    except run_labels.InvalidLabels as exc:
        raise ApiError(400, str(exc), field="labels") from None
    except InvalidInput as exc:
        raise ApiError(400, str(exc)) from None
    return Status(201, summary_json(run))


@api.get(
    "/runs/{run_id}",
    response={200: s.RunDetail, **_errors(400, 401, 403, 404)},
    summary="A run with its steps and tool calls",
)
def get_run(
    request: HttpRequest,
    run_id: RunId,
    steps_offset: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="Steps to skip (in step order).")
    ] = 0,
    steps_limit: Annotated[
        int,
        Query(
            ge=1,
            le=STEPS_MAX_LIMIT,
            description=f"Steps in this page (default {STEPS_DEFAULT_LIMIT}); "
            "`steps_next_offset` says where the next page starts.",
        ),
    ] = STEPS_DEFAULT_LIMIT,
) -> dict[str, Any]:
    return detail_json(_get_run(run_id), steps_offset, steps_limit)


@api.get(
    "/runs/{run_id}/snapshots/{step}/{at}",
    response={200: s.Snapshot, **_errors(401, 403, 404)},
    summary="The agent's whole state before (pre) or after (post) a step",
)
def get_snapshot(
    request: HttpRequest,
    run_id: RunId,
    step: Annotated[int, Path(ge=s.FIRST_STEP, le=MAX_STEP, description="The step number.")],
    at: Annotated[s.At, Path(description="Before or after the step.")],
) -> dict[str, Any]:
    run = _get_run(run_id)
    if run.purged_at is not None:
        raise ApiError(404, f"run {run.pk} was purged by retention: its snapshots are gone")
    try:
        snap = snapshots.get(run.pk, step, at)
    except Snapshot.DoesNotExist:
        raise ApiError(404, f"run {run.pk} has no {at} snapshot of step {step}") from None
    return {
        "step": snap.step,
        "at": snap.at,
        "hash": snap.hash,
        "state": snapshots.load_state(snap),
    }


ACTION_ERRORS = _errors(400, 401, 403, 404, 409, 413)
NO_REASON = s.Reason.model_validate({})  # no body at all
UNPIN_NO_REASON = s.UnpinRequest.model_validate({})


@api.post(
    "/runs/{run_id}/cancel",
    response={200: s.RunDetail, **ACTION_ERRORS},
    summary="Cancel an active run (operators); hybrid calls are compensated",
)
def cancel_run(request: HttpRequest, run_id: RunId, body: s.Reason = NO_REASON) -> dict:
    return _with_reason(request, run_id, body, services.cancel_run)


@api.post(
    "/runs/{run_id}/retry",
    response={200: s.RunDetail, **ACTION_ERRORS},
    summary="Try again the step of a run waiting after it kept crashing (operators)",
)
def retry_step(request: HttpRequest, run_id: RunId, body: s.Reason = NO_REASON) -> dict:
    return _with_reason(request, run_id, body, services.retry_crashed_step)


def _with_reason(
    request: HttpRequest, run_id: uuid.UUID, body: s.Reason, action: Any
) -> dict[str, Any]:
    """An operator's action on a run that takes only a reason; 409 if it doesn't apply."""
    run = _get_run(run_id)
    try:
        action(run, user=request.user, reason=body.reason)
    except services.ActionError as exc:
        raise ApiError(409, str(exc)) from None
    return detail_json(_get_run(run_id))


@api.post(
    "/runs/{run_id}/approve",
    response={200: s.RunDetail, **ACTION_ERRORS},
    summary="Approve or reject the call a waiting run is parked on (operators)",
)
def decide_approval(request: HttpRequest, run_id: RunId, body: s.Approve) -> dict[str, Any]:
    run = _get_run(run_id)
    try:
        services.decide_approval(
            run,
            user=request.user,
            decision=body.decision,
            comment=body.comment,
            resolution=body.resolution,
        )
    except services.ActionError as exc:
        raise ApiError(409, str(exc)) from None
    return detail_json(_get_run(run_id))


@api.post(
    "/runs/{run_id}/fork",
    response={201: s.RunDetail, 400: s.ForkError, **_errors(401, 403, 404, 409, 413)},
    summary="Start a new run from a snapshot of this one, optionally with an edited state "
    "(operators); the parent never changes",
)
def fork_run(
    request: HttpRequest, run_id: RunId, body: s.Fork, response: HttpResponse
) -> Status[dict[str, Any]]:
    """Start a new run from a snapshot of this one (DESIGN section 6, replay modes)."""
    run = _get_run(run_id)
    if body.step > MAX_STEP:  # below 1, services.fork_run says the run has no such snapshot
        raise ApiError(
            400, f"step {body.step} is out of range: no run has that many steps", field="step"
        )
    try:
        fork = services.fork_run(
            run,
            step=body.step,
            at=body.at,
            state=body.state,
            mode=body.mode,
            reason=body.reason,
            user=request.user,
            confirm_live=body.confirm_live,
            labels=body.labels,
            version=body.version,
        )
    except services.ForkError as exc:
        if exc.field != "confirm_live":
            raise ApiError(400, str(exc), field=exc.field) from None
        effects = services.side_effects_after(run, body.step, body.at)
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
    response["Location"] = f"/api/runs/{fork.pk}"
    return Status(201, detail_json(_get_run(fork.pk)))


@api.get(
    "/runs/{run_id}/side-effects",
    response={200: s.SideEffects, **_errors(400, 401, 403, 404)},
    summary="The parent's write/hybrid calls a live fork from a snapshot would run again "
    "(show them before confirming)",
)
def get_side_effects(
    request: HttpRequest,
    run_id: RunId,
    step: Annotated[int, Query(ge=s.FIRST_STEP, le=MAX_STEP, description="The fork point's step.")],
    at: Annotated[s.At, Query(description="Before or after the step.")] = "pre",
) -> dict[str, Any]:
    run = _get_run(run_id)
    if not Snapshot.objects.filter(run=run, seq=Snapshot.seq_for(step, at)).exists():
        last = run.steps.order_by("-number").values_list("number", flat=True).first()
        known = f"steps {run.first_step}..{last}" if last else "no steps yet"
        raise ApiError(400, f"run has no {at} snapshot of step {step} ({known})", field="step")
    effects = services.side_effects_after(run, step, at)
    return {
        "run_id": str(run.pk),
        "step": step,
        "at": at,
        "confirm_live_required": bool(effects),
        "side_effects": [_side_effect(tc) for tc in effects],
    }


@api.get(
    "/ledger",
    response={200: s.Ledger, **_errors(400, 401, 403, 404)},
    summary="What the built-in ledger_write tool wrote for a run",
)
def get_ledger(
    request: HttpRequest, run: Annotated[uuid.UUID, Query(description="The run's id.")]
) -> dict[str, Any]:
    found = _get_run(run)
    entries = LedgerEntry.objects.filter(run=found).order_by("created_at", "pk")
    invocations = LedgerInvocation.objects.filter(run=found).order_by("idempotency_key")
    return {
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


@api.get(
    "/inflight",
    response={200: s.InFlight, **_errors(400, 401, 403)},
    summary="Every step in flight now, by state and worker, longest waits first",
)
def get_in_flight(
    request: HttpRequest,
    state: Annotated[s.InFlightState | None, Query(description="Only runs in this state.")] = None,  # type: ignore[valid-type]
    worker: Annotated[
        str,
        Query(
            max_length=s.WORKER_MAX_LENGTH,
            pattern=TEXT_PATTERN,
            description="Only this worker's runs (host:pid); `none`: the runs nobody holds.",
        ),
    ] = "",
    limit: Annotated[
        int, Query(ge=1, le=inflight.MAX_LIMIT, description="Runs listed per state.")
    ] = inflight.LIMIT,
) -> dict[str, Any]:
    """What the Now page shows: every active run's current step, by state and worker."""
    return inflight_json(inflight.snapshot(worker=worker, state=state or "", limit=limit))


# --- pins -----------------------------------------------------------------


@api.post(
    "/runs/{run_id}/pin",
    response={200: s.RunDetail, **ACTION_ERRORS},
    summary="Keep a run from retention, with its fork ancestors and descendants (operators); "
    "pinning a pinned run changes its reason",
)
def pin_run(request: HttpRequest, run_id: RunId, body: s.PinRequest) -> dict[str, Any]:
    return _pin_action(request, run_id, services.pin_run, body.reason)


@api.post(
    "/runs/{run_id}/unpin",
    response={200: s.RunDetail, **ACTION_ERRORS},
    summary="Let retention purge a pinned run again when its time comes (operators)",
)
def unpin_run(
    request: HttpRequest, run_id: RunId, body: s.UnpinRequest = UNPIN_NO_REASON
) -> dict[str, Any]:
    return _pin_action(request, run_id, services.unpin_run, body.reason)


def _pin_action(request: HttpRequest, run_id: uuid.UUID, action: Any, reason: str) -> dict:
    run = _get_run(run_id)
    try:
        action(run, user=request.user, reason=reason)
    except services.PinError as exc:
        raise ApiError(400, str(exc), field="reason") from None
    except services.ActionError as exc:
        raise ApiError(409, str(exc)) from None
    return detail_json(_get_run(run_id))


# --- export and import (agentrun.lifecycle.archive) ----------------------------------------------------

ARCHIVE_BODY = {"type": "string", "format": "binary"}
ARCHIVE_TYPES = ("application/gzip", "application/x-gzip", "application/octet-stream")


@api.get(
    "/runs/{run_id}/export",
    response={200: None, **_errors(400, 401, 403, 404, 409)},
    summary="The run as a self-contained archive: gzip'ed JSON lines (docs/ARCHIVE.md)",
    openapi_extra={
        "responses": {
            200: {
                "description": "The archive, streamed as an attachment.",
                "content": {archive.MEDIA_TYPE: {"schema": ARCHIVE_BODY}},
            }
        }
    },
)
def export_run(
    request: HttpRequest,
    run_id: RunId,
    ancestors: Annotated[
        bool, Query(description="Also the runs it was forked from, oldest first.")
    ] = False,
) -> StreamingHttpResponse:
    run = _get_run(run_id)
    problem = archive.export_problem(run)
    if problem:
        raise ApiError(409, problem)
    return archive_response(run, ancestors=ancestors, user=request.user)


def archive_response(run: Run, *, ancestors: bool, user: Any) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        archive.export_chunks(run, ancestors=ancestors, user=user),
        content_type=archive.MEDIA_TYPE,
    )
    response["Content-Disposition"] = f'attachment; filename="{archive.filename(run)}"'
    return response


# --- the audit trail's chains (agentrun.audit) -------------------------------------------


@api.get(
    "/audit/verify",
    response={200: dict[str, Any], **_errors(401, 403)},
    summary="Verify the audit trail's hash chains now: the first broken link, if any",
)
def verify_audit(request: HttpRequest) -> dict[str, Any]:
    return chain.verify().as_dict()


@api.get(
    "/audit/export",
    response={200: None, **_errors(400, 401, 403)},
    summary="The event log with its hashes, as CSV or JSON lines, to verify offline",
    openapi_extra={
        "responses": {
            200: {
                "description": "The events in stream order, streamed as an attachment.",
                "content": {
                    "text/csv": {"schema": {"type": "string"}},
                    "application/jsonl": {"schema": {"type": "string"}},
                },
            }
        }
    },
)
def export_audit(
    request: HttpRequest,
    format: Annotated[
        str, Query(pattern="^(csv|jsonl)$", description="`csv` or `jsonl` (JSON lines).")
    ] = "jsonl",
    run: Annotated[uuid.UUID | None, Query(description="Only the events of this run.")] = None,
    operator: Annotated[
        str,
        Query(max_length=150, pattern=TEXT_PATTERN, description="Only events by this actor."),
    ] = "",
    action: Annotated[
        str,
        Query(max_length=40, pattern=TEXT_PATTERN, description="Only events of this kind."),
    ] = "",
    since: Annotated[
        datetime | None,
        Query(description="Written at or after this date and time (or a date: its start)."),
    ] = None,
    until: Annotated[
        datetime | None,
        Query(description="Written before this date and time (or a date: its end)."),
    ] = None,
) -> StreamingHttpResponse:
    try:
        which = audit_export.Filter(
            run=run,
            operator=operator,
            action=action,
            # As given: a date alone means the whole day (selection).
            since=selection.moment(request.GET.get("since") if since else None, "since", end=False),
            until=selection.moment(request.GET.get("until") if until else None, "until", end=True),
        )
    except selection.SelectionError as exc:
        raise ApiError(400, str(exc), field=exc.field) from None
    response = StreamingHttpResponse(
        audit_export.lines(which, format), content_type=audit_export.FORMATS[format]
    )
    name = audit_export.filename(format, timezone.now())
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@api.post(
    "/runs/import",
    response={201: s.Imported, **_errors(400, 401, 403, 409, 413)},
    summary="Import a run's archive, read-only (operators); a bad archive stores nothing",
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The archive as exported (GET /api/runs/{run_id}/export).",
            "content": {t: {"schema": ARCHIVE_BODY} for t in ARCHIVE_TYPES},
        }
    },
)
def import_run(request: HttpRequest, response: HttpResponse) -> Status[dict[str, Any]]:
    content_type = request.content_type or ""
    if not request.headers.get("Content-Length", "").strip("0"):
        raise ApiError(
            400, f"the archive is empty: send it as the request body ({archive.MEDIA_TYPE})"
        )
    if content_type not in ARCHIVE_TYPES:
        raise ApiError(
            400,
            f"send the archive itself as the request body, with Content-Type "
            f"{archive.MEDIA_TYPE} (not {content_type or 'none'})",
        )
    limit = settings.AGENTRUN_IMPORT_MAX_BYTES
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        declared = 0
    if declared > limit:  # refused before a byte is read
        raise ApiError(413, f"the archive is larger than the limit of {limit} bytes")
    with tempfile.TemporaryFile() as spool:
        try:
            archive.spool(request, spool)
            spool.seek(0)
            runs = archive.import_archive(lambda: _Rewound(spool), user=request.user)
        except archive.ArchiveError as exc:
            raise ApiError(exc.status, str(exc)) from None
    root = _get_run(runs[-1].pk)
    response["Location"] = f"/api/runs/{root.pk}"
    return Status(
        201,
        {
            "run": summary_json(root),
            "runs": [str(r.pk) for r in runs],
            "steps": root.steps.count(),
            "snapshots": root.snapshots.count(),
            "archive_sha256": root.imported["archive_sha256"],
        },
    )


class _Rewound:
    """The spooled archive from its start, as a context manager that leaves it open."""

    def __init__(self, spool: Any):
        self.spool = spool

    def __enter__(self) -> Any:
        self.spool.seek(0)
        return self.spool

    def __exit__(self, *exc: Any) -> None:
        return None


@api.get(
    "/openapi.json",
    auth=None,
    response=dict[str, Any],
    summary="This document",
    description="An OpenAPI 3.1 document. Public: it holds nothing a caller can't learn "
    "from a 401.",
)
def get_open_api(request: HttpRequest) -> dict[str, Any]:
    return api.document()


# --- search within a run (debugger.search) -----------------------------------------------

# One rule for every criterion: empty is the same as absent (as the run page's form sends
# them), and no criterion at all matches every step.
SEARCH_PHASES = s.one_of(("", *search.PHASES))
SEARCH_CALL = s.one_of(("", *ToolCallStatus.values))
SEARCH_STEP = s.one_of(("", *StepStatus.values))
SEARCH_KIND = s.one_of(("", "read", "write", "hybrid"))


@api.get(
    "/runs/{run_id}/search",
    response={200: s.StepSearch, **_errors(400, 401, 403, 404)},
    summary="The steps of a run that match a filter, as the run page's search (an empty "
    "criterion is no criterion; none at all: every step)",
)
def search_steps(
    request: HttpRequest,
    run_id: RunId,
    q: Annotated[
        str,
        Query(
            max_length=search.TEXT_MAX_CHARS,
            pattern=TEXT_PATTERN,
            description="Text in a thought, rationale, final answer, or a tool call's "
            "arguments or result, in any case.",
        ),
    ] = "",
    tool: Annotated[
        str, Query(max_length=100, pattern=TEXT_PATTERN, description="A tool name.")
    ] = "",
    kind: Annotated[SEARCH_KIND | None, Query(description="A call of this kind.")] = None,  # type: ignore[valid-type]
    call: Annotated[SEARCH_CALL | None, Query(description="A call with this status.")] = None,  # type: ignore[valid-type]
    status: Annotated[SEARCH_STEP | None, Query(description="The step's status.")] = None,  # type: ignore[valid-type]
    phase: Annotated[SEARCH_PHASES | None, Query(description="The phase after the step.")] = None,  # type: ignore[valid-type]
    retried: Annotated[bool, Query(description="Steps tried more than once.")] = False,
    waits: Annotated[
        bool, Query(description="Steps that waited (backoff, crash, approval, doubt).")
    ] = False,
) -> dict[str, Any]:
    """Tool, kind and call status must hold for the same call. An empty criterion is the
    same as an absent one; no criterion: every step. A tool the run never called matches
    no step."""
    run = _get_run(run_id)
    steps = search.matching_steps(
        run,
        q=q.strip(),
        tool=tool,
        kind=kind or "",
        call=call or "",
        status=status or "",
        phase=phase or "",
        retried=retried,
        waits=waits,
    )
    return {"run_id": run.pk, "steps": sorted(steps), "count": len(steps)}


# --- the history of one value -------------------------------------------------


@api.get(
    "/runs/{run_id}/history",
    response={200: s.PathHistory, **_errors(400, 401, 403, 404)},
    summary="Every step that changed one value of the state, with before and after",
)
def get_history(
    request: HttpRequest,
    run_id: RunId,
    path: Annotated[
        str,
        Query(
            min_length=1,
            max_length=watch.MAX_PATH_CHARS,
            pattern=TEXT_PATTERN,
            description="A JSON pointer (`/memory/notes/cart`) or a dotted path "
            "(`memory.notes.cart`, `history.3.content`, `history[3]`).",
        ),
    ],
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Changes per page.")] = (
        DEFAULT_LIMIT
    ),
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Changes to skip.")] = 0,
) -> dict[str, Any]:
    """A fork's history goes on into its parent before the fork point (`inherited`).

    Paged, oldest first: the run is read only as far as the page needs (and a little
    further, to count a history of up to 200 changes whole). A longer history's `count`
    is null until its last page; `more` and `next_offset` say where the next page starts.
    """
    run = _get_run(run_id)
    try:
        parsed = watch.parse_path(path)
    except watch.PathSyntaxError as exc:
        raise ApiError(400, str(exc), field="path") from None
    # Scanned only as far as the page (a value every step changes: its first changes).
    found = watch.history(run, parsed, limit=max(offset + limit, watch.COUNTED))
    page = found.changes[offset : offset + limit]
    details = watch.step_details(page)
    more = found.more or len(found.changes) > offset + limit
    return {
        "run_id": run.pk,
        "path": found.display,
        "pointer": watch.pointer(parsed),
        "ever_existed": found.ever_existed,
        "exists_now": found.exists_now,
        "start": {
            "run_id": found.start.run_id,
            "step": found.start.step,
            "at": found.start.at,
            "exists": found.start.exists,
            **watch.value_json("value", found.start.value),
        },
        "count": None if found.more else len(found.changes),
        "more": more,
        "next_offset": offset + limit if more else None,
        "changes": [watch.change_json(c, details) for c in page],
        "snapshots_read": found.snapshots_read,
    }


# --- replay batches (agentrun.lifecycle.batches) ----------------------------------------------

BatchId = Annotated[uuid.UUID, Path(description="A replay batch's id.")]
BATCH_RUNS_DEFAULT = 100


def _get_batch(batch_id: uuid.UUID | str) -> ReplayBatch:
    batch = ReplayBatch.objects.select_related("created_by").filter(pk=batch_id).first()
    if batch is None:
        raise ApiError(404, f"no batch {batch_id}")
    return batch


def _preview_json(plan: batches.Plan) -> dict[str, Any]:
    return {
        "count": plan.count,
        "skipped": plan.skipped,
        "mode": plan.mode,
        "version": plan.version,
        "from": plan.start.as_json(),
        "side_effects": plan.side_effects,
        "runs": [
            {"parent": str(i.run.pk), "step": i.step, "skip_reason": i.skip_reason}
            for i in plan.items[:1000]
        ],
    }


def batch_json(batch: ReplayBatch, offset: int = 0, limit: int | None = 0) -> dict[str, Any]:
    items = BatchItem.objects.filter(batch=batch).order_by("position")
    total = items.count()
    page = []
    if limit:
        for item in items.select_related("fork")[offset : offset + limit]:
            page.append(
                {
                    "position": item.position,
                    "parent": str(item.parent_id),
                    "step": item.step,
                    "status": item.status,
                    "skip_reason": item.skip_reason,
                    "fork": str(item.fork_id) if item.fork_id else None,
                    "fork_status": item.fork.status if item.fork else "",
                    "verdict": item.verdict,
                }
            )
    following = offset + len(page)
    counts = batches.counts(batch)
    return {
        "id": str(batch.pk),
        "name": batch.name,
        "reason": batch.reason,
        "status": batch.status,
        "mode": batch.mode,
        "version": batch.version,
        "from": batch.start_from,
        "filter": batch.selection,
        "max_in_flight": batch.max_in_flight,
        "count": total - counts["runs"]["skipped"],
        "created_by": batch.created_by.get_username() if batch.created_by else None,
        "created_at": batch.created_at,
        "finished_at": batch.finished_at,
        "promoted_from": str(batch.promoted_from_id) if batch.promoted_from_id else None,
        "counts": counts,
        "runs": page,
        "runs_total": total,
        "runs_offset": offset,
        "runs_next_offset": following if limit and following < total else None,
    }


def _batch_error(exc: batches.BatchError) -> ApiError:
    return ApiError(400, str(exc), field=exc.field)


@api.post(
    "/batches",
    response={201: s.Batch, 200: s.BatchPreview, **_errors(400, 401, 403)},
    summary="Replay the runs a filter selects, each from its own fork point (operators); "
    "dry_run: the preview",
    by_alias=True,
)
def create_batch(
    request: HttpRequest, body: s.CreateBatch, response: HttpResponse
) -> Status[dict[str, Any]]:
    try:
        if body.dry_run:
            plan = batches.plan(body.filter, body.start_from, body.mode, body.version)
            return Status(200, _preview_json(plan))
        batch = batches.create(
            body.filter,
            body.start_from,
            mode=body.mode,
            version=body.version,
            name=body.name,
            reason=body.reason,
            max_in_flight=body.max_in_flight,
            user=request.user,
            confirm_live=body.confirm_live,
        )
    except batches.BatchError as exc:
        raise _batch_error(exc) from None
    response["Location"] = f"/api/batches/{batch.pk}"
    return Status(201, batch_json(batch, 0, BATCH_RUNS_DEFAULT))


@api.get(
    "/batches",
    response={200: s.BatchList, **_errors(400, 401, 403)},
    summary="Replay batches, newest first",
    by_alias=True,
)
def list_batches(
    request: HttpRequest,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Batches to skip.")] = 0,
) -> dict[str, Any]:
    qs = ReplayBatch.objects.select_related("created_by").order_by("-created_at", "-id")
    return {
        "items": [batch_json(b) for b in qs[offset : offset + limit]],
        "count": qs.count(),
    }


@api.get(
    "/batches/{batch_id}",
    response={200: s.Batch, **_errors(400, 401, 403, 404)},
    summary="A replay batch: its progress, its counts by state and by verdict, a page of its "
    "runs (each with its fork and verdict)",
    by_alias=True,
)
def get_batch(
    request: HttpRequest,
    batch_id: BatchId,
    runs_offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Runs to skip.")] = 0,
    runs_limit: Annotated[
        int, Query(ge=1, le=MAX_LIMIT, description="Runs in this page.")
    ] = BATCH_RUNS_DEFAULT,
) -> dict[str, Any]:
    return batch_json(_get_batch(batch_id), runs_offset, runs_limit)


@api.post(
    "/batches/{batch_id}/cancel",
    response={200: s.Batch, **_errors(400, 401, 403, 404, 409)},
    summary="Stop making forks; those made run to their end (operators)",
    by_alias=True,
)
def cancel_batch(
    request: HttpRequest, batch_id: BatchId, body: s.Reason = NO_REASON
) -> dict[str, Any]:
    batch = _get_batch(batch_id)
    try:
        batch = batches.cancel(batch, user=request.user, reason=body.reason)
    except batches.BatchError as exc:
        raise ApiError(409 if not exc.field else 400, str(exc), field=exc.field) from None
    return batch_json(batch, 0, BATCH_RUNS_DEFAULT)


@api.post(
    "/batches/{batch_id}/promote",
    response={201: s.Batch, 200: s.BatchPreview, **_errors(400, 401, 403, 404, 409)},
    summary="Replay live, as a new batch, the runs whose fork succeeded (operators); "
    "dry_run: the preview",
    by_alias=True,
)
def promote_batch(
    request: HttpRequest, batch_id: BatchId, body: s.PromoteBatch, response: HttpResponse
) -> Status[dict[str, Any]]:
    batch = _get_batch(batch_id)
    try:
        if body.dry_run:
            return Status(200, _preview_json(batches.promotion_plan(batch, version=body.version)))
        live = batches.promote(
            batch,
            user=request.user,
            name=body.name,
            reason=body.reason,
            version=body.version,
            max_in_flight=body.max_in_flight,
            confirm_live=body.confirm_live,
        )
    except batches.BatchError as exc:
        raise ApiError(409 if not exc.field else 400, str(exc), field=exc.field) from None
    response["Location"] = f"/api/batches/{live.pk}"
    return Status(201, batch_json(live, 0, BATCH_RUNS_DEFAULT))


# --- a model request, as it was sent --------------------------------------------------------


@api.get(
    "/runs/{run_id}/steps/{step}/request",
    response={200: s.ModelRequest, **_errors(400, 401, 403, 404)},
    summary="The request an `llm` step sent to the model, exactly, and what it added to the "
    "previous one",
)
def get_model_request(
    request: HttpRequest,
    run_id: RunId,
    step: Annotated[int, Path(ge=s.FIRST_STEP, le=MAX_STEP, description="The step number.")],
) -> Any:
    rebuilt, changed = _model_request(run_id, step)
    return {
        "run_id": run_id,
        "step": step,
        "exact": rebuilt.exact,
        "body": rebuilt.body,
        "bytes": len(rebuilt.bytes),
        "positions": rebuilt.positions,
        "previous_step": changed.previous,
        "added": changed.added,
        "dropped": changed.dropped,
    }


@api.get(
    "/runs/{run_id}/steps/{step}/request/body",
    response={200: dict[str, Any], **_errors(400, 401, 403, 404)},
    summary="The body an `llm` step sent to the model, its exact bytes",
)
def get_model_request_body(
    request: HttpRequest,
    run_id: RunId,
    step: Annotated[int, Path(ge=s.FIRST_STEP, le=MAX_STEP, description="The step number.")],
) -> HttpResponse:
    rebuilt, _ = _model_request(run_id, step)
    return HttpResponse(rebuilt.bytes, content_type="application/json")


def _model_request(run_id: Any, step: int) -> tuple[Any, Any]:
    run = _get_run(run_id)
    if run.purged_at is not None:
        raise ApiError(404, f"run {run.pk} was purged by retention: its snapshots are gone")
    row = Step.objects.filter(run=run, number=step).first()
    if row is None:
        raise ApiError(404, f"run {run.pk} has no step {step}")
    try:
        rebuilt = llm_requests.rebuild(row)
        changed = llm_requests.changes(row)
    except llm_requests.NotAnLLMStep as exc:
        raise ApiError(404, str(exc)) from None
    except LookupError as exc:
        raise ApiError(404, f"the request can't be rebuilt: {exc}") from None
    return rebuilt, changed
