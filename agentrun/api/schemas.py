"""The JSON API's request and response bodies: the one description of the contract.

Django Ninja validates requests with these models and renders responses through
them; the OpenAPI document at /api/openapi.json is generated from them. Request
models are strict (JSON true is no integer, "2" is no number) and refuse unknown
members; response models refuse members they don't declare, so a view can't send
what the document doesn't say.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from agentrun.engine import inflight
from agentrun.engine.versions import VERSION_MAX_LENGTH, VERSION_PATTERN
from agentrun.lifecycle import labels as run_labels
from agentrun.lifecycle.services import FORK_MODES, PIN_REASON_MAX, REASON_MAX_LENGTH
from agentrun.models import (
    ReplayMode,
    Run,
    RunStatus,
    StepStatus,
    ToolCallStatus,
    WaitReason,
)
from agentrun.security.storable import TEXT_PATTERN

#: A fork point or snapshot beyond this is out of range (snapshot positions are 32-bit).
MAX_STEP = 10**9
AGENT_MAX_LENGTH = Run._meta.get_field("agent").max_length
#: A worker is its lease owner's host:pid.
WORKER_MAX_LENGTH = Run._meta.get_field("lease_owner").max_length
#: Steps are numbered from 1 (a fork numbers on from its fork point): no snapshot has
#: a smaller step number.
FIRST_STEP = 1


def one_of(values: Any) -> Any:
    """Literal[values...]: the enum of a field, from the model's choices."""
    return Literal[tuple(str(v) for v in values)]  # type: ignore[valid-type]


#: What agentrun.security.storable.parse_json refuses anywhere in a body, for free-form objects
#: (the members' own schemas say it with a pattern).
STORABLE_JSON = (
    "Its strings and keys hold no NUL (\\u0000) and no lone surrogate; its numbers are "
    "finite, its integers at most 100 digits long."
)
#: Text the database can store (agentrun.security.storable checks every request before this does).
Text = Annotated[str, StringConstraints(pattern=TEXT_PATTERN)]
#: A reason or comment for the audit trail: as long as the forms allow, no longer.
AuditText = Annotated[Text, StringConstraints(max_length=REASON_MAX_LENGTH)]
At = Literal["pre", "post"]
#: A code version (a release tag, a commit): what agentrun.engine.versions accepts.
Version = Annotated[
    str, StringConstraints(pattern=VERSION_PATTERN, min_length=1, max_length=VERSION_MAX_LENGTH)
]
RunStatusName = one_of(RunStatus.values)
InFlightState = one_of(inflight.BY_KEY)
ToolKind = Literal["read", "write", "hybrid"]


#: A run's labels as a request member: what agentrun.lifecycle.labels enforces, for the document.
LABELS_SCHEMA: dict[str, Any] = {
    "maxProperties": run_labels.MAX_LABELS,
    "propertyNames": {
        "pattern": run_labels.KEY_PATTERN,
        "maxLength": run_labels.KEY_MAX_LENGTH,
        "not": {"enum": list(run_labels.RESERVED_KEYS)},
    },
    "additionalProperties": {
        "type": "string",
        "minLength": 1,
        "maxLength": run_labels.VALUE_MAX_LENGTH,
        "pattern": run_labels.VALUE_PATTERN,
    },
}


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests ------------------------------------------------------------------------


class CreateRun(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"agent": "scripted", "input": {"goal": "greet", "steps": [{"final": "hi"}]}}
            ]
        }
    )

    agent: Annotated[
        Text,
        Field(
            min_length=1,
            max_length=AGENT_MAX_LENGTH,
            description="A registered agent, such as `scripted`.",
        ),
    ]
    input: dict[str, Any] = Field(
        description="The agent's input; validated by the agent. " + STORABLE_JSON
    )
    labels: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form labels to find the run by (`GET /api/runs?label=key=value`), "
        f"at most {run_labels.MAX_LABELS}: keys of 1-{run_labels.KEY_MAX_LENGTH} letters, "
        "digits and `. _ - /` that start and end with a letter or digit; values of "
        f"1-{run_labels.VALUE_MAX_LENGTH} characters, no control characters, no space at "
        f"either end. `{run_labels.FORKED_FROM}` is reserved (forks get it).",
        # Checked by agentrun.lifecycle.labels, which says what is wrong in its own words.
        json_schema_extra=LABELS_SCHEMA,
    )


class Reason(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "wrong customer"}]})

    reason: AuditText = Field("", description="Why; recorded in the audit trail.")


class Approve(Request):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"decision": "approve", "comment": "checked the amount"}]}
    )

    decision: Literal["approve", "reject"] = Field(
        description="Approve the call, or reject it (the run fails)."
    )
    comment: AuditText = Field("", description="Why; recorded in the audit trail.")
    resolution: Literal["retry", "mark_done"] | None = Field(
        None,
        description="For a call left in doubt: invoke it again, or record it as done.",
    )


class Fork(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"step": 2, "at": "pre", "mode": "sandbox", "reason": "look again"}]
        }
    )

    step: int = Field(
        description="The step whose snapshot to fork from.",
        # Checked by services.fork_run and api.fork_run, which say why in the
        # terms of the run (which snapshots it has).
        json_schema_extra={"minimum": FIRST_STEP, "maximum": MAX_STEP},
    )
    at: At = Field(
        "pre",
        description="Before the step (the fork redoes it) or after it (the fork starts at "
        "the next step).",
    )
    state: dict[str, Any] | None = Field(
        None,
        description="The whole agent state to start from, edited; null: the snapshot's own. "
        "Validated by the agent. " + STORABLE_JSON,
    )
    mode: one_of(FORK_MODES) = Field(  # type: ignore[valid-type]
        "sandbox",
        description="sandbox: LLM and read tools run, write/hybrid tools are skipped. "
        "recorded: the parent's decisions and results are reused until the state diverges, "
        "then sandbox. live: everything runs for real with the fork's own idempotency keys.",
    )
    reason: AuditText = Field("", description="Why; recorded in the audit trail.")
    confirm_live: bool = Field(
        False,
        description="Required for a live fork when the parent made write/hybrid calls after "
        "the fork point (see side-effects).",
    )
    labels: dict[str, Any] = Field(
        default_factory=dict,
        description="Labels for the fork besides those it inherits from its parent (the same "
        f"rules as a new run's); it also gets `{run_labels.FORKED_FROM}`: the parent's short id.",
        json_schema_extra=LABELS_SCHEMA,
    )
    version: Version | None = Field(
        None,
        description="The code version to run the fork on: only workers of that version "
        "(AGENTRUN_CODE_VERSION) execute it. Null: any worker.",
    )


# --- responses -------------------------------------------------------------------------


# Members an error has only sometimes are absent otherwise (never null).


class Error(Response):
    detail: str
    field: str = Field(
        default_factory=str,
        description="The request member at fault, when there is one (e.g. `step`).",
    )


class ForkedFrom(Response):
    step: int
    at: At


class RunSummary(Response):
    id: UUID
    agent: str
    agent_version: str
    status: RunStatusName  # type: ignore[valid-type]
    wait_reason: one_of(WaitReason.values)  # type: ignore[valid-type]
    phase: str
    parent_id: UUID | None
    forked_from: ForkedFrom | None
    mode: one_of(ReplayMode.values) = Field(  # type: ignore[valid-type]
        description="A fork's replay mode; empty for a run that is no fork."
    )
    divergence_step: int | None = Field(
        description="A recorded fork: the first step whose state differed from the "
        "parent's (from there on it ran in sandbox mode)."
    )
    first_step: int = Field(
        description="1, or for a fork the step it started at: steps are numbered on from "
        "the fork point."
    )
    created_by: str | None = Field(description="A username.")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    next_step: int
    error: str
    final_answer: str
    tokens_in: int
    tokens_out: int
    tokens_cached: int = Field(
        default=0, description="Input tokens the provider served from its prompt cache."
    )
    cost_usd: float = Field(
        default=0.0,
        description="What the run's model calls cost at AGENTRUN_LLM_PRICES (US dollars).",
    )
    labels: dict[str, str] = Field(
        description="The run's labels, by key. A fork has its parent's, and "
        f"`{run_labels.FORKED_FROM}`: the parent's id, its first 8 characters."
    )
    # Pins and retention.
    pin: Pin | None = Field(description="Set while the run is pinned (kept from retention).")
    purged_at: datetime | None = Field(
        description="When retention purged the run's steps, snapshots and read calls; its "
        "events and write/hybrid calls (with their steps) stay."
    )
    purge_after: datetime | None = Field(
        description="A finished, unpinned run: when retention may purge it, at the "
        "earliest (a pinned fork ancestor or descendant keeps it longer). Null when "
        "it is active, pinned, purged, or retention is off."
    )
    # A run imported from an archive.
    imported_at: datetime | None = Field(
        default=None,
        description="When the run was imported from an archive: it is read-only here.",
    )
    # Code versions.
    created_version: str = Field(
        default="", description="The code version of the process that created the run."
    )
    target_version: str = Field(
        default="",
        description="The code version the run asks for: only workers of it execute the run "
        "(empty: any worker).",
    )
    code_version: str = Field(
        default="", description="The code version of the worker that executed its latest step."
    )
    waiting_for_version: bool = Field(
        default=False,
        description="The run is active and asks for a code version no live worker runs: it "
        "waits until one starts.",
    )
    batch_id: UUID | None = Field(default=None, description="The replay batch that made it.")


class ToolCall(Response):
    index: int
    tool: str
    kind: ToolKind
    status: one_of(ToolCallStatus.values)  # type: ignore[valid-type]
    idempotency_key: str = Field(description="{run_id}:{step}:{call_index}:{tool}:{args_hash}")
    attempts: list[dict[str, Any]] = Field(
        description="Every attempt: time, error, backoff, duration."
    )
    args: dict[str, Any]
    result: Any
    error: str
    approval: dict[str, Any] | None
    compensation: dict[str, Any] | None


class Step(Response):
    number: int
    status: one_of(StepStatus.values)  # type: ignore[valid-type]
    attempts: int
    phase_before: str
    phase_after: str
    thought: str
    rationale: str
    decision_count: int
    failure: dict[str, Any] | None = Field(
        description="type, message, traceback, tool, input of a failed step."
    )
    duration_ms: float | None
    started_at: datetime
    finished_at: datetime | None
    worker: str = Field(description="The worker of the step's last attempt.")
    code_version: str = Field(description="The code version of that worker.")
    tokens_in: int
    tokens_out: int
    tokens_cached: int
    cost_usd: float | None = Field(description="Null: no price for the step's model.")
    tool_calls: list[ToolCall]


class RunDetail(RunSummary):
    input: dict[str, Any] = Field(
        description="The run's input as it was given (a fork: its parent's), with secrets "
        "redacted: values of secret-named keys (api_key, password, token...) and "
        "credentials found in text are `[REDACTED]`, as in every state the API shows."
    )
    steps: list[Step] = Field(
        description="One page of the run's steps, in order: `steps_limit` of them from "
        "`steps_offset` (GET /runs/{run_id} takes both; the other operations answer "
        "with the first page)."
    )
    steps_total: int = Field(description="All the run's steps, not just this page.")
    steps_offset: int = Field(description="Steps skipped before this page.")
    steps_limit: int = Field(description="The page size asked for.")
    steps_next_offset: int | None = Field(
        description="The steps_offset of the next page; null on the last one."
    )
    kept_by: UUID | None = Field(
        description="A pinned fork ancestor or descendant that keeps this run from retention."
    )


class RunList(Response):
    items: list[RunSummary]
    count: int = Field(description="All matching runs, not just this page.")


class Snapshot(Response):
    step: int
    at: At
    hash: str = Field(description="The state's content hash: a Merkle hash of its JSON tree.")
    state: dict[str, Any]


class SideEffect(Response):
    step: int
    index: int
    tool: str
    kind: Literal["write", "hybrid"]
    status: one_of(ToolCallStatus.values) = Field(  # type: ignore[valid-type]
        description="The parent's call's status."
    )
    args: dict[str, Any]
    idempotency_key: str = Field(description="The parent's key.")
    compensation: dict[str, Any] | None


class SideEffects(Response):
    run_id: UUID
    step: int
    at: At
    confirm_live_required: bool = Field(
        description="Whether a live fork from here needs confirm_live."
    )
    side_effects: list[SideEffect]


class ForkError(Error):
    side_effects: list[SideEffect] = Field(
        default_factory=list,
        description="With `field` confirm_live: the parent's write/hybrid calls that a live "
        "fork would run again.",
    )


class LedgerEntry(Response):
    idempotency_key: str
    account: str
    amount: str = Field(description="A decimal, as a string.")
    created_at: datetime


class Ledger(Response):
    entries: list[LedgerEntry]
    invocations: dict[str, int] = Field(
        description="How many times ledger_write ran per idempotency key."
    )


StateCounts = create_model(
    "StateCounts",
    __base__=Response,
    __doc__="Runs per state; every state is present.",
    **{key: (int, ...) for key in inflight.BY_KEY},  # type: ignore[call-overload]
)


class InFlightCall(Response):
    index: int
    tool: str
    kind: ToolKind
    status: one_of(ToolCallStatus.values)  # type: ignore[valid-type]
    attempt: int
    running: bool
    error: str
    attempt_at: datetime | None


class InFlightItem(Response):
    run_id: UUID
    agent: str
    state: InFlightState  # type: ignore[valid-type]
    worker: str | None = Field(
        description="host:pid of the worker process holding the step (its lease owner "
        "without the last part); null when nobody holds it."
    )
    lease_owner: str | None
    step: int = Field(description="The step it is at (next_step).")
    attempt: int = Field(description="Attempts at the step so far.")
    since: datetime = Field(
        description="Since when it has waited: the claim (deciding), the decision or the "
        "latest call record (acting), the lease's expiry (stalled), the park or the queueing "
        "(the rest)."
    )
    waited_s: float
    tools: list[str] = Field(description="The tools its decision calls, in order.")
    wake_at: datetime | None = Field(description="backoff: when it is retried.")
    wake_in_s: float | None = Field(description="Negative: overdue.")
    call: InFlightCall | None = Field(
        description="The call it is on: running (acting), awaiting approval, in doubt, or "
        "to be retried (backoff)."
    )


class WorkerCounts(Response):
    worker: str | None = Field(description="null: the runs nobody holds.")
    counts: StateCounts  # type: ignore[valid-type]
    total: int


class InFlightFilter(Response):
    state: one_of(("", *inflight.BY_KEY)) = Field(  # type: ignore[valid-type]
        description="Empty: every state."
    )
    worker: str
    limit: int


class InFlightGroup(Response):
    state: InFlightState  # type: ignore[valid-type]
    title: str
    count: int = Field(description="All, not only those listed.")
    more: int = Field(description="Not listed.")
    items: list[InFlightItem]


class InFlight(Response):
    now: datetime
    total: int = Field(description="Every active run.")
    in_flight: int = Field(description="Every active run but the queued.")
    counts: StateCounts  # type: ignore[valid-type]
    workers: list[WorkerCounts] = Field(description="Counts per worker, whatever the filter.")
    filter: InFlightFilter
    groups: list[InFlightGroup] = Field(
        description="Per state (only the asked-for one with a state filter): the runs that "
        "have waited longest, at most `limit` (queued: 5 unless asked for)."
    )


#: Every member a fork request may have.
FORK_FIELDS = tuple(Fork.model_fields)


# --- pins ---------------------------------------------------------------

#: A reason with something besides blanks (services.BLANK) and no NUL.
PIN_REASON_PATTERN = r"^[^\u0000]*[^\u0000 \t\n\r\f\v][^\u0000]*$"


class Pin(Response):
    at: datetime
    by: str | None = Field(description="The operator who pinned it (a username).")
    reason: str


class PinRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "incident #123"}]})

    reason: Annotated[
        str,
        StringConstraints(pattern=PIN_REASON_PATTERN, min_length=1, max_length=PIN_REASON_MAX),
    ] = Field(description="Why the run is kept, e.g. the incident; recorded in the audit trail.")


class UnpinRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "incident closed"}]})

    reason: Annotated[Text, StringConstraints(max_length=PIN_REASON_MAX)] = Field(
        "", description="Why; recorded in the audit trail."
    )


# RunSummary names Pin before it is defined (above, to keep this block together).
for _model in (RunSummary, RunDetail, RunList):
    _model.model_rebuild()
# --- the history of one value --------------------------------------------------


class ValueChangeDecision(Response):
    thought: str
    rationale: str
    calls: list[dict[str, Any]] = Field(description="The tool calls decided: tool and args.")
    final: str | None


class ValueChangeToolCall(Response):
    index: int
    tool: str
    kind: str
    status: str


class ValueChange(Response):
    run_id: UUID = Field(
        description="The run whose snapshot changed it (a parent's, if inherited)."
    )
    inherited: bool = Field(description="A parent run's change, before the fork point.")
    step: int
    at: At = Field(description="post: the step's own change; pre: an edit before the step.")
    kind: Literal["added", "removed", "set", "moved"]
    how: str = Field(description="What touched the value: set, a spliced list, an ancestor...")
    before_exists: bool
    before: Any = Field(description="The value before (null if absent or truncated).")
    before_truncated: bool = Field(description="The value is too big to include.")
    after_exists: bool
    after: Any = Field(description="The value after (null if absent or truncated).")
    after_truncated: bool
    decision: ValueChangeDecision | None
    tool_calls: list[ValueChangeToolCall]
    diff_url: str = Field(description="The step's diff in the debugger.")


class ValueStart(Response):
    run_id: UUID
    step: int
    at: At
    exists: bool
    value: Any
    truncated: bool


class PathHistory(Response):
    run_id: UUID
    path: str = Field(description="The path in dotted form (memory.notes.cart).")
    pointer: str = Field(description="The path as a JSON pointer (/memory/notes/cart).")
    ever_existed: bool = Field(description="False: no snapshot of the run ever had this path.")
    exists_now: bool = Field(description="The latest snapshot has it.")
    start: ValueStart = Field(description="The value when the (oldest) run began.")
    count: int | None = Field(
        description="All changes, not just this page; null when there are more than 200 "
        "and this page is not the last (the run is read only as far as the page)."
    )
    more: bool = Field(description="Changes after this page: ask for `next_offset`.")
    next_offset: int | None = Field(description="The next page's offset; null on the last.")
    changes: list[ValueChange]
    snapshots_read: int = Field(description="Snapshots whose data the scan read.")


class StepSearch(Response):
    run_id: UUID
    steps: list[int] = Field(description="The numbers of the steps that match, in order.")
    count: int = Field(description="How many steps match.")


# --- export and import (agentrun.lifecycle.archive) ----------------------------------------------


class Imported(Response):
    run: RunSummary = Field(description="The exported run, now here, read-only.")
    runs: list[UUID] = Field(description="Every run imported: fork ancestors first.")
    steps: int
    snapshots: int
    archive_sha256: str = Field(description="SHA-256 of the archive as uploaded.")


# --- replay batches (agentrun.lifecycle.batches) -------------------------------------------

#: Where each run of a batch is forked from.
START_FROM_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "enum": ["before-failure", "start"]},
        {
            "type": "object",
            "properties": {"tool": {"type": "string", "minLength": 1, "maxLength": 100}},
            "required": ["tool"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"step": {"type": "integer", "minimum": 1, "maximum": MAX_STEP}},
            "required": ["step"],
            "additionalProperties": False,
        },
    ]
}
BATCH_FILTER = (
    "The run list's filter: `q`, `status` (or `active`), `agent`, `label` (a `key=value` "
    "or `key`, or a list of them), `pinned`, `since` and `until` (a date or ISO date and "
    "time), `error` (text in the run's error), `version` (the code version of its latest "
    "step), `tool_failed` (a call to this tool failed). An unknown member is refused."
)


class CreateBatch(Request):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {
                    "filter": {"label": "problem=stale-cart", "status": "failed"},
                    "from": "before-failure",
                    "mode": "sandbox",
                    "version": "v2",
                    "name": "stale carts, after the fix",
                    "reason": "incident 42",
                    "dry_run": True,
                }
            ]
        },
    )

    filter: dict[str, Any] = Field(default_factory=dict, description=BATCH_FILTER)
    start_from: Any = Field(
        "before-failure",
        alias="from",
        description='Where each run is forked: "before-failure" (the pre snapshot of its '
        'first failed step), "start", {"tool": T} (before its first call to T) or '
        '{"step": N}. A run without that point is skipped, saying why.',
        json_schema_extra=START_FROM_SCHEMA,
    )
    mode: one_of(FORK_MODES) = Field(  # type: ignore[valid-type]
        "sandbox",
        description="sandbox (the default: no side effect happens), recorded, or live "
        "(needs confirm_live).",
    )
    version: Version | None = Field(
        None, description="Run the forks on this code version only. Null: any worker."
    )
    name: Annotated[Text, StringConstraints(min_length=1, max_length=200)] = Field(
        description="What the batch repairs, e.g. the incident; recorded in the audit trail."
    )
    reason: AuditText = Field("", description="Why; recorded in the audit trail.")
    max_in_flight: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="The batch's forks active at once (default AGENTRUN_BATCH_MAX_IN_FLIGHT).",
    )
    dry_run: bool = Field(False, description="Answer the preview; create nothing.")
    confirm_live: bool = Field(False, description="Required for a live batch.")


class PromoteBatch(Request):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"confirm_live": True, "reason": "the fix works"}]}
    )

    name: Annotated[Text, StringConstraints(min_length=1, max_length=200)] | None = Field(
        None, description="The live batch's name (default: this one's, marked live)."
    )
    reason: AuditText = Field("", description="Why; recorded in the audit trail.")
    version: Version | None = Field(
        None, description="The code version to run on (default: this batch's)."
    )
    max_in_flight: int | None = Field(None, ge=1, le=10_000)
    dry_run: bool = Field(False, description="Answer the preview; create nothing.")
    confirm_live: bool = Field(False, description="Required: the replay runs live.")


class PlannedRun(Response):
    parent: UUID = Field(description="The run to replay.")
    step: int | None = Field(description="The fork point: the pre snapshot of this step.")
    skip_reason: str = Field(description="Why the run is skipped (it has no fork point).")


class BatchPreview(Response):
    count: int = Field(description="The runs that would be forked.")
    skipped: int = Field(description="The runs selected without a fork point.")
    mode: str
    version: str
    start_from: Any = Field(alias="from", json_schema_extra=START_FROM_SCHEMA)
    side_effects: dict[str, int] = Field(
        description="A live batch: the write/hybrid calls it would let happen, by tool (for "
        "a promotion, those the sandbox forks skipped)."
    )
    runs: list[PlannedRun] = Field(description="Each run and its fork point (at most 1,000).")


class BatchRun(Response):
    position: int
    parent: UUID
    step: int | None
    status: one_of(("pending", "forked", "skipped"))  # type: ignore[valid-type]
    skip_reason: str
    fork: UUID | None
    fork_status: str = Field(description="The fork's run status (empty before its fork).")
    verdict: str = Field(
        description="Once the fork ended: fixed, still_failing, failing_differently, "
        "changed_side_effects, unchanged or cancelled."
    )


class BatchCounts(Response):
    runs: dict[str, int] = Field(
        description="pending (not forked yet), running, succeeded, failed, cancelled, skipped."
    )
    verdicts: dict[str, int]
    spent: dict[str, float] = Field(
        description="What the batch's forks used: tokens_in, tokens_out, cost_usd."
    )


class Batch(Response):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: UUID
    name: str
    reason: str
    status: one_of(("running", "done", "cancelled"))  # type: ignore[valid-type]
    mode: str
    version: str
    start_from: Any = Field(alias="from", json_schema_extra=START_FROM_SCHEMA)
    filter: dict[str, Any]
    max_in_flight: int
    count: int = Field(description="The runs to fork (the skipped ones aside).")
    created_by: str | None
    created_at: datetime
    finished_at: datetime | None
    promoted_from: UUID | None
    counts: BatchCounts
    runs: list[BatchRun] = Field(description="One page of the batch's runs, in order.")
    runs_total: int
    runs_offset: int
    runs_next_offset: int | None


class BatchList(Response):
    items: list[Batch] = Field(description="Newest first; each without its runs.")
    count: int


# --- a model request, as it was sent (agentrun.builtin.llm_requests) -------------------------


class ModelRequest(Response):
    run_id: UUID
    step: int
    exact: bool = Field(
        description="Rebuilt byte for byte from the run's history (true), or a request "
        "recorded whole before requests were references (false: its body as stored)."
    )
    body: dict[str, Any] = Field(
        description="The request's JSON body as it was sent: model, messages, tools "
        "(`.../request/body` answers its exact bytes)."
    )
    bytes: int = Field(description="The size of the body as sent.")
    positions: list[int] = Field(description="Where its messages are in the run's history.")
    previous_step: int | None = Field(description="The step of the run's previous request.")
    added: list[int] = Field(
        description="History positions sent now and not in the previous request."
    )
    dropped: list[int] = Field(
        description="History positions of the previous request left out of this one (the "
        "context window)."
    )
