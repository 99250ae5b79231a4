"""The OpenAPI 3.1 description of the JSON API, served at /api/openapi.json.

Written by hand: the API is small, and this is its contract. Path parameters
carry the names of the URL converters in agentrun.api_urls, and a test checks
that every pattern there appears here.
"""

from __future__ import annotations

from typing import Any

from agentrun.models import ToolCallStatus

# From the model, so the document can't fall behind a new status.
TOOL_CALL_STATUSES = [str(s) for s in ToolCallStatus.values]
RUN_STATUSES = ["queued", "running", "waiting", "succeeded", "failed", "cancelled"]
# agentrun.inflight.STATES, in its order.
INFLIGHT_STATES = [
    "deciding",
    "acting",
    "backoff",
    "approval",
    "crashed",
    "in_doubt",
    "stalled",
    "queued",
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    reasons = {
        400: "Invalid input; `detail` names the problem (and `field` the input, where one is "
        "to blame). Nothing was stored.",
        401: "No credentials, or an invalid token.",
        403: "No role, not an operator, or a failed CSRF check (session POSTs).",
        404: "No such run or snapshot (an invalid UUID is not found either).",
        409: "The action doesn't apply to the run as it is.",
        413: "The request body is larger than the server accepts.",
    }
    return {str(code): _json(_ref("Error"), reasons[code]) for code in codes}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _path(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _query(
    name: str, description: str, schema: dict[str, Any], required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "description": description,
        "schema": schema,
    }


RUN_ID = _path("run_id", "The run's id, a UUID.", {"type": "string", "format": "uuid"})
NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
ANY_JSON: dict[str, Any] = {}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["detail"],
        "properties": {
            "detail": {"type": "string"},
            "field": {
                "type": "string",
                "description": "The request member at fault, when there is one (e.g. `step`).",
            },
        },
    },
    "ForkError": {
        "allOf": [
            _ref("Error"),
            {
                "type": "object",
                "properties": {
                    "side_effects": {
                        "type": "array",
                        "items": _ref("SideEffect"),
                        "description": "With `field` confirm_live: the parent's write/hybrid "
                        "calls that a live fork would run again.",
                    }
                },
            },
        ]
    },
    "Fork": {
        "type": "object",
        "required": ["step"],
        "additionalProperties": False,
        "properties": {
            "step": {"type": "integer", "description": "The step whose snapshot to fork from."},
            "at": {
                "enum": ["pre", "post"],
                "default": "pre",
                "description": "Before the step (the fork redoes it) or after it (the fork "
                "starts at the next step).",
            },
            "state": {
                "type": ["object", "null"],
                "default": None,
                "description": "The whole agent state to start from, edited; null: the "
                "snapshot's own. Validated by the agent.",
            },
            "mode": {
                "enum": ["sandbox", "recorded", "live"],
                "default": "sandbox",
                "description": "sandbox: LLM and read tools run, write/hybrid tools are "
                "skipped. recorded: the parent's decisions and results are reused until the "
                "state diverges, then sandbox. live: everything runs for real with the fork's "
                "own idempotency keys.",
            },
            "reason": {"type": "string", "description": "Why; recorded in the audit trail."},
            "confirm_live": {
                "type": "boolean",
                "default": False,
                "description": "Required for a live fork when the parent made write/hybrid "
                "calls after the fork point (see side-effects).",
            },
        },
    },
    "SideEffect": {
        "type": "object",
        "properties": {
            "step": {"type": "integer"},
            "index": {"type": "integer"},
            "tool": {"type": "string"},
            "kind": {"enum": ["write", "hybrid"]},
            "status": {"type": "string", "description": "The parent's call's status."},
            "args": {"type": "object"},
            "idempotency_key": {"type": "string", "description": "The parent's key."},
            "compensation": {"type": ["object", "null"]},
        },
    },
    "SideEffects": {
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "step": {"type": "integer"},
            "at": {"enum": ["pre", "post"]},
            "confirm_live_required": {
                "type": "boolean",
                "description": "Whether a live fork from here needs confirm_live.",
            },
            "side_effects": {"type": "array", "items": _ref("SideEffect")},
        },
    },
    "CreateRun": {
        "type": "object",
        "required": ["agent", "input"],
        "additionalProperties": False,
        "properties": {
            "agent": {"type": "string", "description": "A registered agent, e.g. `scripted`."},
            "input": {
                "type": "object",
                "description": "The agent's input; validated by the agent.",
            },
        },
    },
    "Cancel": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"reason": {"type": "string"}},
    },
    "Approve": {
        "type": "object",
        "required": ["decision"],
        "additionalProperties": False,
        "properties": {
            "decision": {"enum": ["approve", "reject"]},
            "comment": {"type": "string"},
            "resolution": {
                "enum": ["retry", "mark_done"],
                "description": "For a call left in doubt: invoke it again, or record it as done.",
            },
        },
    },
    "RunSummary": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "agent": {"type": "string"},
            "agent_version": {"type": "string"},
            "status": {"enum": RUN_STATUSES},
            "wait_reason": {"enum": ["", "approval", "in_doubt", "backoff", "crashed"]},
            "phase": {"type": "string"},
            "parent_id": {"type": ["string", "null"], "format": "uuid"},
            "forked_from": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "properties": {
                            "step": {"type": "integer"},
                            "at": {"enum": ["pre", "post"]},
                        },
                    },
                ]
            },
            "mode": {
                "enum": ["", "sandbox", "recorded", "live"],
                "description": "A fork's replay mode; empty for a run that is no fork.",
            },
            "divergence_step": {
                "type": ["integer", "null"],
                "description": "A recorded fork: the first step whose state differed from "
                "the parent's (from there on it ran in sandbox mode).",
            },
            "first_step": {
                "type": "integer",
                "description": "1, or for a fork the step it started at: steps are numbered "
                "on from the fork point.",
            },
            "created_by": {"type": ["string", "null"], "description": "A username."},
            "created_at": {"type": "string", "format": "date-time"},
            "started_at": NULLABLE_TIME,
            "finished_at": NULLABLE_TIME,
            "next_step": {"type": "integer"},
            "error": {"type": "string"},
            "final_answer": {"type": "string"},
            "tokens_in": {"type": "integer"},
            "tokens_out": {"type": "integer"},
        },
    },
    "RunDetail": {
        "allOf": [
            _ref("RunSummary"),
            {
                "type": "object",
                "properties": {"steps": {"type": "array", "items": _ref("Step")}},
            },
        ]
    },
    "Step": {
        "type": "object",
        "properties": {
            "number": {"type": "integer"},
            "status": {"enum": ["running", "waiting", "succeeded", "failed", "cancelled"]},
            "attempts": {"type": "integer"},
            "phase_before": {"type": "string"},
            "phase_after": {"type": "string"},
            "thought": {"type": "string"},
            "rationale": {"type": "string"},
            "decision_count": {"type": "integer"},
            "failure": {
                "type": ["object", "null"],
                "description": "type, message, traceback, tool, input of a failed step.",
            },
            "duration_ms": {"type": ["number", "null"]},
            "started_at": {"type": "string", "format": "date-time"},
            "finished_at": NULLABLE_TIME,
            "tool_calls": {"type": "array", "items": _ref("ToolCall")},
        },
    },
    "ToolCall": {
        "type": "object",
        "properties": {
            "index": {"type": "integer"},
            "tool": {"type": "string"},
            "kind": {"enum": ["read", "write", "hybrid"]},
            "status": {"enum": TOOL_CALL_STATUSES},
            "idempotency_key": {
                "type": "string",
                "description": "{run_id}:{step}:{call_index}:{tool}:{args_hash}",
            },
            "attempts": {
                "type": "array",
                "items": {"type": "object"},
                "description": "Every attempt: time, error, backoff, duration.",
            },
            "args": {"type": "object"},
            "result": ANY_JSON,
            "error": {"type": "string"},
            "approval": {"type": ["object", "null"]},
            "compensation": {"type": ["object", "null"]},
        },
    },
    "RunList": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": _ref("RunSummary")},
            "count": {"type": "integer", "description": "All matching runs, not just this page."},
        },
    },
    "Snapshot": {
        "type": "object",
        "properties": {
            "step": {"type": "integer"},
            "at": {"enum": ["pre", "post"]},
            "hash": {"type": "string", "description": "sha256 of the state's canonical JSON."},
            "state": {"type": "object"},
        },
    },
    "StateCounts": {
        "type": "object",
        "description": "Runs per state; every state is present.",
        "properties": {state: {"type": "integer"} for state in INFLIGHT_STATES},
    },
    "InFlightItem": {
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "agent": {"type": "string"},
            "state": {"enum": INFLIGHT_STATES},
            "worker": {
                "type": ["string", "null"],
                "description": "host:pid of the worker process holding the step (its lease "
                "owner without the last part); null when nobody holds it.",
            },
            "lease_owner": {"type": ["string", "null"]},
            "step": {"type": "integer", "description": "The step it is at (next_step)."},
            "attempt": {"type": "integer", "description": "Attempts at the step so far."},
            "since": {
                "type": "string",
                "format": "date-time",
                "description": "Since when it has waited: the claim (deciding), the decision "
                "or the latest call record (acting), the lease's expiry (stalled), the park "
                "or the queueing (the rest).",
            },
            "waited_s": {"type": "number"},
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The tools its decision calls, in order.",
            },
            "wake_at": {**NULLABLE_TIME, "description": "backoff: when it is retried."},
            "wake_in_s": {"type": ["number", "null"], "description": "Negative: overdue."},
            "call": {
                "description": "The call it is on: running (acting), awaiting approval, in "
                "doubt, or to be retried (backoff).",
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "properties": {
                            "index": {"type": "integer"},
                            "tool": {"type": "string"},
                            "kind": {"enum": ["read", "write", "hybrid"]},
                            "status": {"type": "string"},
                            "attempt": {"type": "integer"},
                            "running": {"type": "boolean"},
                            "error": {"type": "string"},
                            "attempt_at": NULLABLE_TIME,
                        },
                    },
                ],
            },
        },
    },
    "InFlight": {
        "type": "object",
        "properties": {
            "now": {"type": "string", "format": "date-time"},
            "total": {"type": "integer", "description": "Every active run."},
            "in_flight": {"type": "integer", "description": "Every active run but the queued."},
            "counts": _ref("StateCounts"),
            "workers": {
                "type": "array",
                "description": "Counts per worker (null: runs nobody holds), whatever the filter.",
                "items": {
                    "type": "object",
                    "properties": {
                        "worker": {"type": ["string", "null"]},
                        "counts": _ref("StateCounts"),
                        "total": {"type": "integer"},
                    },
                },
            },
            "filter": {
                "type": "object",
                "properties": {
                    "state": {"type": "string"},
                    "worker": {"type": "string"},
                    "limit": {"type": "integer"},
                },
            },
            "groups": {
                "type": "array",
                "description": "Per state (only the asked-for one with a state filter): the "
                "runs that have waited longest, at most `limit` (queued: 5 unless asked for).",
                "items": {
                    "type": "object",
                    "properties": {
                        "state": {"enum": INFLIGHT_STATES},
                        "title": {"type": "string"},
                        "count": {"type": "integer", "description": "All, not only those listed."},
                        "more": {"type": "integer", "description": "Not listed."},
                        "items": {"type": "array", "items": _ref("InFlightItem")},
                    },
                },
            },
        },
    },
    "Ledger": {
        "type": "object",
        "properties": {
            "entries": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "idempotency_key": {"type": "string"},
                        "account": {"type": "string"},
                        "amount": {"type": "string", "description": "A decimal, as a string."},
                        "created_at": {"type": "string", "format": "date-time"},
                    },
                },
            },
            "invocations": {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "description": "How many times ledger_write ran per idempotency key.",
            },
        },
    },
}

PATHS: dict[str, Any] = {
    "/api/runs": {
        "get": {
            "operationId": "listRuns",
            "summary": "Runs, newest first",
            "parameters": [
                _query("status", "Only runs with this status.", {"enum": RUN_STATUSES}),
                _query("agent", "Only runs of this agent.", {"type": "string"}),
                _query(
                    "limit",
                    "Page size.",
                    {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                ),
                _query("offset", "Runs to skip.", {"type": "integer", "minimum": 0, "default": 0}),
            ],
            "responses": {
                "200": _json(_ref("RunList"), "A page of runs."),
                **_errors(400, 401, 403),
            },
        },
        "post": {
            "operationId": "startRun",
            "summary": "Start a run (operators)",
            "requestBody": _body("CreateRun"),
            "responses": {
                "201": _json(_ref("RunSummary"), "The queued run."),
                **_errors(400, 401, 403, 413),
            },
        },
    },
    "/api/runs/{run_id}": {
        "get": {
            "operationId": "getRun",
            "summary": "A run with its steps and tool calls",
            "parameters": [RUN_ID],
            "responses": {"200": _json(_ref("RunDetail"), "The run."), **_errors(401, 403, 404)},
        }
    },
    "/api/runs/{run_id}/snapshots/{step}/{at}": {
        "get": {
            "operationId": "getSnapshot",
            "summary": "The agent's whole state before (pre) or after (post) a step",
            "parameters": [
                RUN_ID,
                _path("step", "The step number.", {"type": "integer", "minimum": 0}),
                _path("at", "Before or after the step.", {"enum": ["pre", "post"]}),
            ],
            "responses": {
                "200": _json(_ref("Snapshot"), "The snapshot."),
                **_errors(401, 403, 404),
            },
        }
    },
    "/api/runs/{run_id}/cancel": {
        "post": {
            "operationId": "cancelRun",
            "summary": "Cancel an active run (operators); hybrid calls are compensated",
            "parameters": [RUN_ID],
            "requestBody": {**_body("Cancel"), "required": False},
            "responses": {
                "200": _json(_ref("RunDetail"), "The cancelled run."),
                **_errors(400, 401, 403, 404, 409, 413),
            },
        }
    },
    "/api/runs/{run_id}/retry": {
        "post": {
            "operationId": "retryStep",
            "summary": "Try again the step of a run waiting after it kept crashing (operators)",
            "parameters": [RUN_ID],
            "requestBody": {**_body("Cancel"), "required": False},
            "responses": {
                "200": _json(_ref("RunDetail"), "The run, queued again."),
                **_errors(400, 401, 403, 404, 409, 413),
            },
        }
    },
    "/api/runs/{run_id}/approve": {
        "post": {
            "operationId": "decideApproval",
            "summary": "Approve or reject the call a waiting run is parked on (operators)",
            "parameters": [RUN_ID],
            "requestBody": _body("Approve"),
            "responses": {
                "200": _json(_ref("RunDetail"), "The run, queued again."),
                **_errors(400, 401, 403, 404, 409, 413),
            },
        }
    },
    "/api/runs/{run_id}/fork": {
        "post": {
            "operationId": "forkRun",
            "summary": "Start a new run from a snapshot of this one, optionally with an edited "
            "state (operators); the parent never changes",
            "parameters": [RUN_ID],
            "requestBody": _body("Fork"),
            "responses": {
                "201": _json(_ref("RunDetail"), "The fork, queued."),
                "400": _json(
                    _ref("ForkError"),
                    "Invalid input; `detail` names the problem and `field` the member. For a "
                    "live fork without confirm_live, `side_effects` lists the parent's calls "
                    "that would run again. Nothing was stored.",
                ),
                **_errors(401, 403, 404, 409, 413),
            },
        }
    },
    "/api/runs/{run_id}/side-effects": {
        "get": {
            "operationId": "getSideEffects",
            "summary": "The parent's write/hybrid calls a live fork from a snapshot would run "
            "again (show them before confirming)",
            "parameters": [
                RUN_ID,
                _query("step", "The fork point's step.", {"type": "integer"}, required=True),
                _query(
                    "at", "Before or after the step.", {"enum": ["pre", "post"], "default": "pre"}
                ),
            ],
            "responses": {
                "200": _json(_ref("SideEffects"), "The calls, in step order."),
                **_errors(400, 401, 403, 404),
            },
        }
    },
    "/api/inflight": {
        "get": {
            "operationId": "getInFlight",
            "summary": "Every step in flight now, by state and worker, longest waits first",
            "parameters": [
                _query("state", "Only runs in this state.", {"enum": INFLIGHT_STATES}),
                _query(
                    "worker",
                    "Only this worker's runs (host:pid); `none`: the runs nobody holds.",
                    {"type": "string"},
                ),
                _query(
                    "limit",
                    "Runs listed per state.",
                    {"type": "integer", "minimum": 1, "maximum": 500, "default": 50},
                ),
            ],
            "responses": {
                "200": _json(_ref("InFlight"), "What is in flight."),
                **_errors(400, 401, 403),
            },
        }
    },
    "/api/ledger": {
        "get": {
            "operationId": "getLedger",
            "summary": "What the built-in ledger_write tool wrote for a run",
            "parameters": [
                _query("run", "The run's id.", {"type": "string", "format": "uuid"}, required=True),
            ],
            "responses": {
                "200": _json(_ref("Ledger"), "Entries and invocation counts."),
                **_errors(400, 401, 403, 404),
            },
        }
    },
    "/api/openapi.json": {
        "get": {
            "operationId": "getOpenApi",
            "summary": "This document",
            "security": [],
            "responses": {"200": _json({"type": "object"}, "An OpenAPI 3.1 document.")},
        }
    },
}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agentrun",
            "version": "1",
            "description": (
                'Durable LLM agent runs. Every error is JSON `{"detail": "..."}`. '
                "Authenticate with a Bearer token (`manage.py apitoken NAME`) or a session; "
                "session-authenticated POSTs need the csrftoken cookie's value in X-CSRFToken. "
                "Reading needs any role; every POST needs the operator role."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}, {"sessionAuth": []}],
        "paths": PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "sessionAuth": {"type": "apiKey", "in": "cookie", "name": "sessionid"},
            },
        },
    }
