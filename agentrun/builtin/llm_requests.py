"""The `llm` agent's requests, recorded as references into the run's conversation.

A request's messages are the run's history (the state's `history`, stored once, as the
snapshot store's deltas) as it was before the step, cut to fit the context window. So a
decision records which messages it sent (ranges of history positions), the model, the
tools and their definitions (as JSON text, the first time this process records them for the
run, then their digest), and how many messages fell out of the window; never the messages
again. The cost of a decision's bookkeeping (its redaction, checks, hashing, storage) is
then what the step added, not the whole context; and a fork, whose first snapshot is a
reference into its parent's, shares its parent's messages up to the fork point.

`rebuild` turns a step's reference back into the request body byte for byte as it was sent
(the pre snapshot's history, the same conversion and JSON encoding); `changes` says what a
request added to the previous one and what fell out of the window. A decision from before
references (`messages` held whole) is read as it is.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.models import Step
from agentrun.state import AgentState, history_to_messages
from agentrun.store import snapshots

#: The format of a request that references the history (a decision's llm.request.format).
FORMAT = 2

# The runs whose tool definitions this process has recorded whole, by digest (bounded).
_DEFINED: OrderedDict[tuple[str, str], None] = OrderedDict()
_DEFINED_MAX = 100_000
_LOCK = threading.Lock()


def encode(body: Mapping[str, Any]) -> bytes:
    """The request body's bytes, as the client sends them."""
    return json.dumps(body).encode()


def join(model: str, messages: Sequence[bytes], definitions: Sequence[Any] | None) -> bytes:
    """`encode({"model": model, "messages": ..., "tools": definitions})` (no "tools" when
    there are none), joined from each message's JSON (`json.dumps(message).encode()`)
    instead of encoding the whole conversation again: the same bytes, since `json.dumps`
    writes a list's and an object's members with the same separators at any depth. The
    body is made in one piece (a join of the parts), not copied again to add its ends."""
    head = b'{"model": ' + json.dumps(model).encode() + b', "messages": ['
    tail = b"]"
    if definitions:
        tail += b', "tools": ' + json.dumps(definitions).encode()
    tail += b"}"
    if not messages:
        return head + tail
    parts = list(messages)
    parts[0] = head + parts[0]
    parts[-1] = parts[-1] + tail
    return b", ".join(parts)


def digest(definitions: Sequence[Mapping[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(definitions, sort_keys=True).encode()).hexdigest()[:16]


def ranges(indices: Iterable[int]) -> list[list[int]]:
    """Sorted positions as [start, end) ranges: [0, 5, 6, 7] → [[0, 1], [5, 8]]."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def positions(spans: Iterable[Sequence[int]]) -> list[int]:
    return [i for start, end in spans for i in range(start, end)]


def reference(
    *,
    run_id: str,
    model: str,
    names: list[str],
    definitions: list[dict[str, Any]],
    history_len: int,
    sent: list[list[int]],
) -> dict[str, Any]:
    """What a decision records of the request it sent (FORMAT); `sent` is the history
    positions of its messages as [start, end) ranges (`ranges`)."""
    tools_digest = digest(definitions) if definitions else ""
    request: dict[str, Any] = {
        "format": FORMAT,
        "model": model,
        "tools": names,
        "history": history_len,
        "messages": sent,
    }
    count = sum(end - start for start, end in sent)
    if history_len > count:
        request["dropped_messages"] = history_len - count
    if definitions:
        request["definitions_digest"] = tools_digest
        key = (run_id, tools_digest)
        with _LOCK:
            known = key in _DEFINED
            if not known:
                _DEFINED[key] = None
                while len(_DEFINED) > _DEFINED_MAX:
                    _DEFINED.popitem(last=False)
        if not known:
            # As text: a JSON column (jsonb) would reorder the keys, and the bytes sent
            # follow the order the definitions were built in.
            request["definitions"] = json.dumps(definitions)
    return request


def forget_definitions() -> None:
    """As in a new process (tests): the next decision of each run records them whole."""
    with _LOCK:
        _DEFINED.clear()


def is_reference(request: Any) -> bool:
    return isinstance(request, dict) and request.get("format") == FORMAT


@dataclass
class Rebuilt:
    step: int
    body: dict[str, Any]  # the request as sent (messages, model, tools)
    positions: list[int]  # the history positions of its messages
    history: list[dict[str, Any]]  # the whole conversation before the step
    exact: bool  # rebuilt from a reference (byte for byte), or a request stored whole

    @property
    def bytes(self) -> bytes:
        return encode(self.body)


class NotAnLLMStep(LookupError):
    """The step has no recorded model request (not an `llm` step, or not decided yet)."""


def _definitions(step: Step, request: dict[str, Any]) -> list[dict[str, Any]] | None:
    if "definitions" in request:
        return json.loads(request["definitions"])
    wanted = request.get("definitions_digest")
    if not wanted:
        return None
    earlier = (
        Step.objects.filter(run_id=step.run_id, number__lt=step.number)
        .exclude(decision=None)
        .order_by("-number")
        .values_list("decision", flat=True)
    )
    for decision in earlier.iterator(chunk_size=100):
        llm = (decision or {}).get("llm") or {}
        other = llm.get("request") or {}
        if other.get("definitions_digest") == wanted and "definitions" in other:
            return json.loads(other["definitions"])
    raise LookupError(
        f"step {step.number}: the tool definitions it sent ({wanted}) are on no earlier step"
    )


def rebuild(step: Step) -> Rebuilt:
    """The request a step sent: its body exactly as it was, and where its messages came from."""
    llm = (step.decision or {}).get("llm") or {}
    request = llm.get("request")
    if not isinstance(request, dict):
        raise NotAnLLMStep(f"step {step.number} has no recorded model request")
    if not is_reference(request):  # recorded whole, before references
        body = {"model": request.get("model"), "messages": request.get("messages") or []}
        return Rebuilt(step.number, body, [], [], exact=False)
    state = snapshots.load(step.run_id, step.number, "pre")
    history = history_to_messages(AgentState.from_dict(state))
    if len(history) != request["history"]:
        raise LookupError(
            f"step {step.number}: its pre snapshot holds {len(history)} messages, the request"
            f" was built from {request['history']}"
        )
    sent = positions(request["messages"])
    body: dict[str, Any] = {"model": request["model"], "messages": [history[i] for i in sent]}
    definitions = _definitions(step, request)
    if definitions:
        body["tools"] = definitions
    return Rebuilt(step.number, body, sent, history, exact=True)


@dataclass
class Changes:
    added: list[int]  # history positions sent now and not the previous time
    dropped: list[int]  # sent the previous time, not now (out of the window)
    previous: int | None  # the step of the previous request


def changes(step: Step) -> Changes:
    """What this step's request added to the previous request of its run, and what fell out."""
    mine = rebuild(step)
    before = (
        Step.objects.filter(run_id=step.run_id, number__lt=step.number)
        .exclude(decision=None)
        .order_by("-number")
        .first()
    )
    if before is None:
        return Changes(mine.positions, [], None)
    try:
        theirs = rebuild(before)
    except (NotAnLLMStep, LookupError):
        return Changes(mine.positions, [], None)
    now, then = set(mine.positions), set(theirs.positions)
    return Changes(sorted(now - then), sorted(then - now), before.number)
