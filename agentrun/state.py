"""Typed, serialisable state of one agent run.

An :class:`AgentState` is what a run step reads, changes and hands back to be
snapshotted. It holds the lifecycle :class:`Phase`, the chat history, the
agent's working memory, and logs of tool calls, decisions and failures.

Snapshots are plain JSON-able dicts made by :meth:`AgentState.to_dict` and read
back by :meth:`AgentState.from_dict`, which validates them (operators edit
snapshots by hand in the debugger) and migrates older schema versions.

Items of the list fields (messages, tool-call records, decisions, failures)
are treated as immutable once recorded: serialisation shares them by identity
instead of copying them, which the snapshot delta encoder relies on. To change
a recorded item, replace it (see :meth:`AgentState.update_tool_call`).

Standard library only.
"""

from __future__ import annotations

import json
import math
import traceback as traceback_module
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import is_
from typing import Any

from agentrun.store import prefixes

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "MIGRATIONS",
    "ROLES",
    "SCHEMA_VERSION",
    "TRANSITIONS",
    "AgentState",
    "IllegalTransition",
    "Phase",
    "StateError",
    "estimate_tokens",
    "MessageWindow",
    "history_to_messages",
    "message_tokens",
    "truncate_history",
    "validate_successor",
]

#: Version of the snapshot layout written by :meth:`AgentState.to_dict`.
SCHEMA_VERSION = 1

#: Roles a history message may have.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


class Phase(StrEnum):
    """Lifecycle phase of an agent run; the value is the lower-case name.

    A ``str`` subclass: ``Phase.PLANNING == "planning"`` and ``str()`` gives the value.
    """

    IDLE = "idle"
    PLANNING = "planning"
    EXECUTING = "executing"
    REFLECTING = "reflecting"
    WAITING = "waiting"
    DONE = "done"
    ERROR = "error"


#: Legal moves: ``TRANSITIONS[current]`` is the set of phases reachable from
#: ``current``. DONE and ERROR are terminal. Every non-terminal phase may move
#: to ERROR, so a failure can always be recorded.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.IDLE: frozenset({Phase.PLANNING, Phase.ERROR}),
    Phase.PLANNING: frozenset(
        {Phase.EXECUTING, Phase.REFLECTING, Phase.WAITING, Phase.DONE, Phase.ERROR}
    ),
    Phase.EXECUTING: frozenset({Phase.REFLECTING, Phase.WAITING, Phase.ERROR, Phase.DONE}),
    Phase.REFLECTING: frozenset({Phase.PLANNING, Phase.DONE, Phase.ERROR}),
    Phase.WAITING: frozenset({Phase.EXECUTING, Phase.PLANNING, Phase.ERROR}),
    Phase.DONE: frozenset(),
    Phase.ERROR: frozenset(),
}


class IllegalTransition(ValueError):
    """Raised when a phase change is not allowed by :data:`TRANSITIONS`.

    ``source`` and ``target`` hold the two phases.
    """

    def __init__(self, source: Phase, target: Phase) -> None:
        self.source = source
        self.target = target
        allowed = ", ".join(sorted(p.value for p in TRANSITIONS[source])) or "none (terminal)"
        super().__init__(
            f"illegal transition {source.value!r} -> {target.value!r}; "
            f"allowed from {source.value!r}: {allowed}"
        )


class StateError(ValueError):
    """A snapshot or a recorded item does not match the state schema.

    The message starts with the path of the offending field, for example
    ``"memory.notes must be an object, got array"`` or
    ``"history[3].role must be one of 'system', 'user', 'assistant', 'tool', got 'bot'"``.
    ``path`` holds that path alone (``""`` for the snapshot as a whole).
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


# --------------------------------------------------------------------------
# Validation helpers. They check types only and never copy item contents,
# because snapshots can hold thousands of messages.
# --------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON Schema name of a value's type: null, boolean, integer, number, string..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _key_path(base: str, key: str) -> str:
    if key.isidentifier():
        return f"{base}.{key}" if base else key
    return f"{base}[{key!r}]"


def _fail(path: str, problem: str) -> StateError:
    return StateError(f"{path} {problem}", path)


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True is never a sensible step or count.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_object(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _fail(path, f"must be an object, got {json_type(value)}")


def _check_list(value: Any, path: str) -> None:
    if not isinstance(value, list):
        raise _fail(path, f"must be an array, got {json_type(value)}")


def _check_str(value: Any, path: str, *, nullable: bool = False) -> None:
    if isinstance(value, str) or (nullable and value is None):
        return
    expected = "a string or null" if nullable else "a string"
    raise _fail(path, f"must be {expected}, got {json_type(value)}")


def _check_count(value: Any, path: str) -> None:
    if not _is_int(value):
        raise _fail(path, f"must be an integer, got {json_type(value)}")
    if value < 0:
        raise _fail(path, f"must be >= 0, got {value}")


def _require(item: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in item:
        raise _fail(_key_path(path, key), "is required")
    return item[key]


def _check_message(msg: Any, path: str) -> None:
    _check_object(msg, path)
    role = _require(msg, "role", path)
    if role not in ROLES:
        allowed = ", ".join(repr(r) for r in ROLES)
        raise _fail(f"{path}.role", f"must be one of {allowed}, got {role!r}")
    tool_calls = msg.get("tool_calls")
    if "tool_calls" in msg and tool_calls is not None:
        if role != "assistant":
            raise _fail(f"{path}.tool_calls", "is only allowed on assistant messages")
        _check_list(tool_calls, f"{path}.tool_calls")
        for i, call in enumerate(tool_calls):
            call_path = f"{path}.tool_calls[{i}]"
            _check_object(call, call_path)
            _check_str(_require(call, "id", call_path), f"{call_path}.id")
            function = _require(call, "function", call_path)
            _check_object(function, f"{call_path}.function")
            _check_str(
                _require(function, "name", f"{call_path}.function"), f"{call_path}.function.name"
            )
    content = _require(msg, "content", path)
    # The chat API sends content=null on assistant turns that only call tools.
    _check_str(content, f"{path}.content", nullable=role == "assistant" and bool(tool_calls))
    if role == "tool":
        _check_str(_require(msg, "tool_call_id", path), f"{path}.tool_call_id")
    elif "tool_call_id" in msg:
        _check_str(msg["tool_call_id"], f"{path}.tool_call_id")
    if "name" in msg:
        _check_str(msg["name"], f"{path}.name")


def _check_tool_call_record(rec: Any, path: str) -> None:
    _check_object(rec, path)
    _check_count(_require(rec, "step", path), f"{path}.step")
    _check_count(_require(rec, "index", path), f"{path}.index")
    _check_str(_require(rec, "tool", path), f"{path}.tool")
    _check_str(_require(rec, "kind", path), f"{path}.kind")
    _check_object(_require(rec, "args", path), f"{path}.args")
    _check_str(_require(rec, "status", path), f"{path}.status")
    _check_count(_require(rec, "attempts", path), f"{path}.attempts")
    # "result" is any JSON value and may be absent while a call is pending.


def _check_decision(rec: Any, path: str) -> None:
    _check_object(rec, path)
    _check_count(_require(rec, "step", path), f"{path}.step")
    _check_str(_require(rec, "thought", path), f"{path}.thought")
    if "rationale" in rec:
        _check_str(rec["rationale"], f"{path}.rationale", nullable=True)
    # "action" is any JSON value (a tool request, "finish", ...).


def _check_failure(rec: Any, path: str) -> None:
    _check_object(rec, path)
    _check_count(_require(rec, "step", path), f"{path}.step")
    _check_str(_require(rec, "type", path), f"{path}.type")
    _check_str(_require(rec, "message", path), f"{path}.message")
    if "tool" in rec:
        _check_str(rec["tool"], f"{path}.tool", nullable=True)
    if "traceback" in rec:
        _check_str(rec["traceback"], f"{path}.traceback", nullable=True)


# Fast paths: plain boolean checks that build no strings. They may reject a
# valid item (e.g. a str subclass); the detailed check above then decides and
# produces the error message with its path, so errors never come from here.
_MISSING = object()
_ROLE_SET = frozenset(ROLES)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _message_ok(msg: Any) -> bool:
    if type(msg) is not dict:
        return False
    role = msg.get("role")
    if role not in _ROLE_SET:
        return False
    content = msg.get("content", _MISSING)
    tool_calls = msg.get("tool_calls")
    if tool_calls is None:
        if type(content) is not str:
            return False
    else:
        if role != "assistant" or type(tool_calls) is not list:
            return False
        if content is not None and type(content) is not str:
            return False
        for call in tool_calls:
            if type(call) is not dict or type(call.get("id")) is not str:
                return False
            function = call.get("function")
            if type(function) is not dict or type(function.get("name")) is not str:
                return False
    tool_call_id = msg.get("tool_call_id", _MISSING)
    if type(tool_call_id) is not str and (role == "tool" or tool_call_id is not _MISSING):
        return False
    name = msg.get("name", _MISSING)
    return name is _MISSING or type(name) is str


def _tool_call_record_ok(rec: Any) -> bool:
    return (
        type(rec) is dict
        and _is_count(rec.get("step"))
        and _is_count(rec.get("index"))
        and type(rec.get("tool")) is str
        and type(rec.get("kind")) is str
        and type(rec.get("args")) is dict
        and type(rec.get("status")) is str
        and _is_count(rec.get("attempts"))
    )


def _decision_ok(rec: Any) -> bool:
    return (
        type(rec) is dict
        and _is_count(rec.get("step"))
        and type(rec.get("thought")) is str
        and type(rec.get("rationale", "")) in (str, type(None))
    )


def _failure_ok(rec: Any) -> bool:
    return (
        type(rec) is dict
        and _is_count(rec.get("step"))
        and type(rec.get("type")) is str
        and type(rec.get("message")) is str
        and type(rec.get("tool")) in (str, type(None))
        and type(rec.get("traceback")) in (str, type(None))
    )


_ITEM_CHECKS: dict[str, tuple[Callable[[Any], bool], Callable[[Any, str], None]]] = {
    "history": (_message_ok, _check_message),
    "tool_calls": (_tool_call_record_ok, _check_tool_call_record),
    "decisions": (_decision_ok, _check_decision),
    "failures": (_failure_ok, _check_failure),
}


def _read_items(data: Mapping[str, Any], name: str) -> list:
    """Validate the list field ``name`` and return a new list sharing its items."""
    if name not in data:
        return []
    items = data[name]
    _check_list(items, name)
    ok, check = _ITEM_CHECKS[name]
    for i, item in enumerate(items):
        if not ok(item):
            check(item, f"{name}[{i}]")
    return list(items)


_MEMORY_KEYS = ("goal", "plan", "completed", "notes")


def _default_memory() -> dict[str, Any]:
    return {"goal": "", "plan": [], "completed": [], "notes": {}}


def _read_memory(value: Any) -> dict[str, Any]:
    _check_object(value, "memory")
    for key in value:
        if key not in _MEMORY_KEYS:
            raise _fail(
                _key_path("memory", str(key)),
                f"is not a memory field (expected one of {', '.join(_MEMORY_KEYS)})",
            )
    memory = _default_memory()
    if "goal" in value:
        _check_str(value["goal"], "memory.goal")
        memory["goal"] = value["goal"]
    for key in ("plan", "completed"):
        if key in value:
            steps = value[key]
            _check_list(steps, f"memory.{key}")
            for i, step in enumerate(steps):
                _check_str(step, f"memory.{key}[{i}]")
            memory[key] = list(steps)
    if "notes" in value:
        notes = value["notes"]
        _check_object(notes, "memory.notes")
        for key, note in notes.items():
            if not isinstance(key, str):
                raise _fail("memory.notes", f"keys must be strings, got {json_type(key)}")
            _check_str(note, _key_path("memory.notes", key))
        memory["notes"] = dict(notes)
    return memory


def _copy_memory(memory: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(memory)
    out["plan"] = list(memory.get("plan", ()))
    out["completed"] = list(memory.get("completed", ()))
    out["notes"] = dict(memory.get("notes", {}))
    out.setdefault("goal", "")
    return out


# --------------------------------------------------------------------------
# Schema migrations.
# --------------------------------------------------------------------------


def _migrate_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 kept the chat history under ``messages``; v1 calls it ``history``."""
    if "messages" not in data:
        return data
    if "history" in data:
        raise StateError(
            "messages: a version 0 snapshot cannot have both 'messages' and 'history'",
            "messages",
        )
    out = {k: v for k, v in data.items() if k != "messages"}
    out["history"] = data["messages"]
    return out


#: ``MIGRATIONS[n]`` turns a version ``n`` snapshot dict into a version ``n + 1``
#: one. To change the layout: bump :data:`SCHEMA_VERSION` and add an entry here.
#: A migration must not mutate its argument and should not copy list items.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    0: _migrate_v0_to_v1,
}


def _migrate(data: dict[str, Any]) -> dict[str, Any]:
    # Snapshots from before the field existed are version 0.
    version = data.get("schema_version", 0)
    if not _is_int(version):
        raise _fail("schema_version", f"must be an integer, got {json_type(version)}")
    if version < 0 or version > SCHEMA_VERSION:
        raise _fail(
            "schema_version", f"is {version}, this code reads versions 0 to {SCHEMA_VERSION}"
        )
    while version < SCHEMA_VERSION:
        migration = MIGRATIONS.get(version)
        if migration is None:
            raise _fail("schema_version", f"is {version} and no migration from it exists")
        data = dict(migration(data))
        version += 1
        data["schema_version"] = version
    return data


_FIELDS = (
    "schema_version",
    "phase",
    "history",
    "memory",
    "tool_calls",
    "decisions",
    "iteration",
    "retries",
    "failures",
    "final_answer",
    "error",
)


# --------------------------------------------------------------------------
# The state.
# --------------------------------------------------------------------------


class _Log(list):  # type: ignore[type-arg]
    """A list field of a typed state that knows whether it only grew since it was read
    from a state dict (or last written to one): then the next dict's list starts with
    that dict's very items, and `agentrun.store.prefixes` is told so. Any other change
    (set, delete, insert, pop, sort...) makes it say nothing."""

    __slots__ = ("source", "source_len", "kept")

    def __init__(self, items: Iterable[Any] = (), source: list | None = None) -> None:
        super().__init__(items)
        self.source = source
        self.source_len = len(source) if source is not None else 0
        self.kept = len(self) if source is not None else -1

    def export(self) -> list:
        """A plain copy, for a state dict; noted as extending the list it came from."""
        out = list.copy(self)  # a plain list; list(self) would iterate a subclass item by item
        source = self.source
        if source is not None and self.kept >= self.source_len == len(source):
            prefixes.note(source, out)
        self.source, self.source_len, self.kept = out, len(out), len(out)
        return out

    def _changed(self) -> None:
        self.kept = -1

    def __setitem__(self, index: Any, value: Any) -> None:
        self._changed()
        super().__setitem__(index, value)

    def __delitem__(self, index: Any) -> None:
        self._changed()
        super().__delitem__(index)

    def __imul__(self, n: Any) -> _Log:  # type: ignore[misc]
        self._changed()
        return super().__imul__(n)

    def insert(self, index: Any, value: Any) -> None:
        self._changed()
        super().insert(index, value)

    def pop(self, index: Any = -1) -> Any:
        self._changed()
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._changed()
        super().remove(value)

    def clear(self) -> None:
        self._changed()
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._changed()
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._changed()
        super().reverse()


def _log_of(data: Mapping[str, Any], name: str, items: Iterable[Any]) -> _Log:
    source = data.get(name)
    return _Log(items, source if type(source) is list else None)


def _export(items: list) -> list:
    return items.export() if type(items) is _Log else list(items)


@dataclass
class AgentState:
    """Everything an agent run needs to continue from where it stopped.

    Fields:

    * ``phase`` -- current :class:`Phase`; change it with :meth:`to` or the
      helpers (:meth:`plan`, :meth:`execute`, ...), which enforce
      :data:`TRANSITIONS`.
    * ``history`` -- chat messages ``{"role", "content", "tool_calls"?,
      "tool_call_id"?, "name"?}``; extra keys are kept but never sent to the
      model (see :func:`history_to_messages`).
    * ``memory`` -- ``{"goal": str, "plan": [str], "completed": [str],
      "notes": {str: str}}``.
    * ``tool_calls`` -- log of ``{"step", "index", "tool", "kind", "args",
      "status", "result", "attempts"}``.
    * ``decisions`` -- log of ``{"step", "thought", "rationale", "action"}``.
    * ``failures`` -- log of ``{"step", "type", "message", "tool",
      "traceback"}``.
    * ``iteration`` / ``retries`` -- counters owned by the runner; the
      ``record_*`` helpers use ``iteration`` as the default step.
    * ``final_answer`` / ``error`` -- set by :meth:`finish` / :meth:`fail`.
    """

    schema_version: int = SCHEMA_VERSION
    phase: Phase = Phase.IDLE
    history: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=_default_memory)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    iteration: int = 0
    retries: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)
    final_answer: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)
        if any(key not in self.memory for key in _MEMORY_KEYS):
            self.memory = {**_default_memory(), **self.memory}

    # ---- phase transitions -------------------------------------------------

    @property
    def is_terminal(self) -> bool:
        """True once the run is DONE or in ERROR."""
        return not TRANSITIONS[self.phase]

    def can(self, phase: Phase | str) -> bool:
        """Whether moving to ``phase`` from the current phase is legal."""
        return Phase(phase) in TRANSITIONS[self.phase]

    def to(self, phase: Phase | str) -> None:
        """Move to ``phase``; raise :class:`IllegalTransition` if not allowed."""
        target = Phase(phase)
        if target not in TRANSITIONS[self.phase]:
            raise IllegalTransition(self.phase, target)
        self.phase = target

    def plan(self) -> None:
        """Move to PLANNING."""
        self.to(Phase.PLANNING)

    def execute(self) -> None:
        """Move to EXECUTING."""
        self.to(Phase.EXECUTING)

    def reflect(self) -> None:
        """Move to REFLECTING."""
        self.to(Phase.REFLECTING)

    def wait(self) -> None:
        """Move to WAITING (for a human, a callback, a rate limit...)."""
        self.to(Phase.WAITING)

    def finish(self, answer: str) -> None:
        """Move to DONE and store ``answer`` as the final answer."""
        _check_str(answer, "final_answer")
        self.to(Phase.DONE)
        self.final_answer = answer

    def fail(self, error: str) -> None:
        """Move to ERROR and store ``error`` as the run's error message."""
        _check_str(error, "error")
        self.to(Phase.ERROR)
        self.error = error

    # ---- recording ---------------------------------------------------------

    def add_message(self, role: str, content: str | None, **extra: Any) -> dict[str, Any]:
        """Append a chat message and return it.

        ``extra`` may hold ``tool_calls``, ``tool_call_id``, ``name`` or
        internal keys of your own. Raises :class:`StateError` if the message
        is malformed (unknown role, tool message without ``tool_call_id``...).
        """
        message = {"role": role, "content": content, **extra}
        _check_message(message, f"history[{len(self.history)}]")
        self.history.append(message)
        return message

    def record_decision(
        self,
        thought: str,
        rationale: str = "",
        action: Any = None,
        *,
        step: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Append a decision (what the agent thought and chose to do) and return it.

        ``step`` defaults to the current ``iteration``.
        """
        record = {
            "step": self.iteration if step is None else step,
            "thought": thought,
            "rationale": rationale,
            "action": action,
            **extra,
        }
        _check_decision(record, f"decisions[{len(self.decisions)}]")
        self.decisions.append(record)
        return record

    def record_tool_call(
        self,
        tool: str,
        args: Mapping[str, Any] | None = None,
        *,
        kind: str = "tool",
        status: str = "ok",
        result: Any = None,
        attempts: int = 1,
        step: int | None = None,
        index: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Append a tool-call record and return it.

        ``step`` defaults to the current ``iteration``; ``index`` defaults to
        the call's position among the calls already recorded for that step.
        To change the record later use :meth:`update_tool_call`.
        """
        step = self.iteration if step is None else step
        if index is None:
            # Records are appended in step order, so only the tail can match.
            index = 0
            for prev in reversed(self.tool_calls):
                if prev.get("step") != step:
                    break
                index += 1
        record = {
            "step": step,
            "index": index,
            "tool": tool,
            "kind": kind,
            "args": dict(args) if args is not None else {},
            "status": status,
            "result": result,
            "attempts": attempts,
            **extra,
        }
        _check_tool_call_record(record, f"tool_calls[{len(self.tool_calls)}]")
        self.tool_calls.append(record)
        return record

    def update_tool_call(self, position: int, **changes: Any) -> dict[str, Any]:
        """Replace ``tool_calls[position]`` by a copy with ``changes`` applied.

        The old dict is left untouched: a snapshot taken earlier may share it,
        and the delta encoder detects changes by identity.
        """
        record = {**self.tool_calls[position], **changes}
        _check_tool_call_record(record, f"tool_calls[{position}]")
        self.tool_calls[position] = record
        return record

    def record_failure(
        self,
        message: str | BaseException,
        *,
        type: str | None = None,  # shadows the builtin to match the record field
        tool: str | None = None,
        traceback: str | None = None,
        step: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Append structured failure context and return it.

        Parameters are named after the record's fields, so a failure dict can
        be passed as ``record_failure(**failure)``; unknown keys (``where``,
        ``input``...) are kept. ``message`` may be an exception: its class
        name, text and traceback are then used unless ``type`` / ``traceback``
        are given. ``type`` defaults to ``"Error"`` for a plain message and
        ``step`` to the current iteration.
        """
        if isinstance(message, BaseException):
            exc = message
            message = str(exc)
            type = type or exc.__class__.__name__
            if traceback is None and exc.__traceback__ is not None:
                traceback = "".join(traceback_module.format_exception(exc))
        record = {
            "step": self.iteration if step is None else step,
            "type": type or "Error",
            "message": message,
            "tool": tool,
            "traceback": traceback,
            **extra,
        }
        _check_failure(record, f"failures[{len(self.failures)}]")
        self.failures.append(record)
        return record

    # ---- serialisation -----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able snapshot dict.

        Top-level lists and the memory dict are new; the items of the list
        fields are the same dict objects as in the state (not copies).
        """
        return {
            "schema_version": self.schema_version,
            "phase": self.phase.value,
            "history": _export(self.history),
            "memory": _copy_memory(self.memory),
            "tool_calls": _export(self.tool_calls),
            "decisions": _export(self.decisions),
            "iteration": self.iteration,
            "retries": self.retries,
            "failures": _export(self.failures),
            "final_answer": self.final_answer,
            "error": self.error,
        }

    @classmethod
    def from_valid(cls, data: Mapping[str, Any]) -> AgentState:
        """A state from a snapshot dict already validated (current schema version): no
        checks, so it costs a copy of the top-level lists, not a walk over every item."""
        memory = data.get("memory")
        return cls(
            schema_version=data["schema_version"],
            phase=Phase(data.get("phase", Phase.IDLE.value)),
            history=_log_of(data, "history", data.get("history", ())),
            memory=_copy_memory(memory) if memory is not None else _default_memory(),
            tool_calls=_log_of(data, "tool_calls", data.get("tool_calls", ())),
            decisions=_log_of(data, "decisions", data.get("decisions", ())),
            iteration=data.get("iteration", 0),
            retries=data.get("retries", 0),
            failures=_log_of(data, "failures", data.get("failures", ())),
            final_answer=data.get("final_answer"),
            error=data.get("error"),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentState:
        """Validate a snapshot dict (any schema version) and build a state.

        Missing fields take their defaults; snapshots without
        ``schema_version`` are version 0 and go through :data:`MIGRATIONS`.
        Raises :class:`StateError` naming the offending path. ``data`` is not
        modified, and list items are shared with it rather than copied.
        """
        if not isinstance(data, Mapping):
            raise StateError(f"state must be an object, got {json_type(data)}")
        data = _migrate(dict(data))
        for key in data:
            if key not in _FIELDS:
                raise _fail(
                    _key_path("", str(key)),
                    f"is not a state field (expected one of {', '.join(_FIELDS)})",
                )

        phase = data.get("phase", Phase.IDLE.value)
        _check_str(phase, "phase")
        try:
            phase = Phase(phase)
        except ValueError:
            raise StateError(f"phase: unknown phase {phase!r}", "phase") from None

        counters = {}
        for name in ("iteration", "retries"):
            counters[name] = data.get(name, 0)
            _check_count(counters[name], name)
        for name in ("final_answer", "error"):
            _check_str(data.get(name), name, nullable=True)

        return cls(
            schema_version=data["schema_version"],
            phase=phase,
            history=_log_of(data, "history", _read_items(data, "history")),
            memory=_read_memory(data["memory"]) if "memory" in data else _default_memory(),
            tool_calls=_log_of(data, "tool_calls", _read_items(data, "tool_calls")),
            decisions=_log_of(data, "decisions", _read_items(data, "decisions")),
            iteration=counters["iteration"],
            retries=counters["retries"],
            failures=_log_of(data, "failures", _read_items(data, "failures")),
            final_answer=data.get("final_answer"),
            error=data.get("error"),
        )


# --------------------------------------------------------------------------
# Checking a state from the one before it (a flat step cost).
# --------------------------------------------------------------------------

_LIST_FIELDS = tuple(_ITEM_CHECKS)


def validate_successor(base: Mapping[str, Any], new: Any) -> None:
    """Validate ``new`` as :meth:`AgentState.from_dict` would, knowing ``base`` is valid.

    A list field of ``new`` that starts with ``base``'s very items (the same objects:
    recorded items are never changed in place) has only the items after them checked,
    so the cost follows what the step added, not the length of the run. Anything else
    (a shorter list, a replaced item, another schema version) is checked in full.
    Raises :class:`StateError` with the same message ``from_dict`` would.
    """
    if not isinstance(new, dict) or new.get("schema_version") != SCHEMA_VERSION:
        AgentState.from_dict(new)
        return
    light = dict(new)
    for name in _LIST_FIELDS:
        old, items = base.get(name, ()), new.get(name, [])
        if (
            type(items) is not list
            or len(items) < len(old)
            or not (prefixes.starts_with(items, old) or all(map(is_, old, items)))
        ):
            AgentState.from_dict(new)
            return
        light[name] = items[len(old) :]
    try:
        AgentState.from_dict(light)
    except StateError:
        AgentState.from_dict(new)  # the message, with the item's real position
        raise


# --------------------------------------------------------------------------
# Chat messages and token budgets.
# --------------------------------------------------------------------------


def _api_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        # The API wants arguments as a JSON string; hand-edited states may hold an object.
        arguments = json.dumps(arguments)
    return {
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": arguments},
    }


def history_to_messages(
    state_or_history: AgentState | Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Return the chat-completions ``messages`` list for a state or a history.

    Each message keeps only ``role``, ``content``, ``tool_calls`` (normalised
    to ``{"id", "type", "function": {"name", "arguments"}}``, omitted when
    empty) and ``tool_call_id``; internal keys (including ``name``) are
    dropped. The history itself is not modified.
    """
    if isinstance(state_or_history, AgentState):
        history: Iterable[Mapping[str, Any]] = state_or_history.history
    else:
        history = state_or_history
    return [_api_message(msg) for msg in history]


def _api_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg["role"], "content": msg.get("content")}
    tool_calls = msg.get("tool_calls")
    # The API rejects an empty tool_calls array, so leave the key out.
    if tool_calls:
        out["tool_calls"] = [_api_tool_call(call) for call in tool_calls]
    elif out["content"] is None:
        out["content"] = ""
    if msg.get("tool_call_id") is not None:
        out["tool_call_id"] = msg["tool_call_id"]
    return out


#: Tokens charged per message for role and framing, on top of its text.
MESSAGE_OVERHEAD_TOKENS = 4


def estimate_tokens(text: str | None) -> int:
    """Rough token count: ``ceil(len(text) / 4)``; 0 for empty or None, else >= 1."""
    if not text:
        return 0
    return math.ceil(len(text) / 4)


def message_tokens(message: Mapping[str, Any]) -> int:
    """Estimated tokens of one chat message, tool-call names and arguments included."""
    content = message.get("content")
    total = MESSAGE_OVERHEAD_TOKENS + estimate_tokens(content if isinstance(content, str) else None)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        total += estimate_tokens(function.get("name")) + estimate_tokens(arguments)
    return total


def _turn_units(messages: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Group message indexes into units that must be kept or dropped together.

    An assistant message with tool calls and the tool messages right after it
    form one unit; every other message is a unit of its own.
    """
    units: list[list[int]] = []
    open_call_unit = False
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "tool" and open_call_unit:
            units[-1].append(i)
            continue
        units.append([i])
        open_call_unit = role == "assistant" and bool(msg.get("tool_calls"))
    return units


def truncate_history(
    messages: Sequence[Mapping[str, Any]], max_tokens: int
) -> list[Mapping[str, Any]]:
    """Fit a message list into ``max_tokens`` (as counted by :func:`message_tokens`).

    Keeps every system message and then as many of the most recent turns as
    fit, in their original order. An assistant message with tool calls is
    kept or dropped together with the tool messages answering it, so no tool
    message is orphaned. The most recent turn is always kept, even when it
    (or the system messages alone) exceeds the budget, because a request
    without it is useless. Returns a new list of the same message objects.
    """
    if not messages:
        return []
    units = _turn_units(messages)
    system_units = [u for u in units if messages[u[0]].get("role") == "system"]
    other_units = [u for u in units if messages[u[0]].get("role") != "system"]

    budget = max_tokens - sum(message_tokens(messages[u[0]]) for u in system_units)
    kept: list[list[int]] = list(system_units)
    for position, unit in enumerate(reversed(other_units)):
        cost = sum(message_tokens(messages[i]) for i in unit)
        if cost > budget and position > 0:
            # Stop at the first turn that does not fit: skipping it and keeping
            # older ones would leave a hole in the conversation.
            break
        kept.append(unit)
        budget -= cost
    indexes = sorted(i for unit in kept for i in unit)
    return [messages[i] for i in indexes]


class MessageWindow:
    """A history's chat messages kept up to date as the history grows, to fit a budget
    at the cost of what was appended rather than of the whole conversation.

    :meth:`extend` converts the new history items as :func:`history_to_messages` does
    and counts them as :func:`message_tokens` does; :meth:`fit` then picks the messages
    :func:`truncate_history` would keep, by a binary search over the running totals of
    the turns (a turn being what ``truncate_history`` keeps or drops as one), instead of
    counting every message again. ``messages`` holds the converted messages and
    ``texts`` each one's JSON (``json.dumps(message).encode()``), for a request body
    joined from them; neither is to be changed (the next step's request shares them).
    """

    __slots__ = (
        "messages",
        "texts",
        "system",
        "system_tokens",
        "turn_starts",
        "tokens_before_turn",
        "other_tokens",
        "size",
        "_open_call",
    )

    def __init__(self, history: Iterable[Mapping[str, Any]] = ()) -> None:
        self.messages: list[dict[str, Any]] = []
        self.texts: list[bytes] = []
        self.system: list[int] = []  # positions of the system messages
        self.system_tokens = 0
        self.turn_starts: list[int] = []  # where each turn of the other messages starts
        self.tokens_before_turn: list[int] = []  # the other messages' tokens before it
        self.other_tokens = 0
        self.size = 0  # the bytes of the messages' JSON
        self._open_call = False  # the last turn is a tool call that tool messages join
        self.extend(history)

    def __len__(self) -> int:
        return len(self.messages)

    def extend(self, history: Iterable[Mapping[str, Any]]) -> None:
        """Append history items (as stored in a state) to the window."""
        for item in history:
            message = _api_message(item)
            tokens = message_tokens(message)
            position = len(self.messages)
            self.messages.append(message)
            text = json.dumps(message).encode()
            self.texts.append(text)
            self.size += len(text)
            role = message["role"]
            if role == "tool" and self._open_call:
                self.other_tokens += tokens  # part of the turn its call started
                continue
            if role == "system":
                self.system.append(position)
                self.system_tokens += tokens
            else:
                self.turn_starts.append(position)
                self.tokens_before_turn.append(self.other_tokens)
                self.other_tokens += tokens
            self._open_call = role == "assistant" and bool(message.get("tool_calls"))

    def fit(self, max_tokens: int) -> tuple[list[int], int, int]:
        """What :func:`truncate_history` keeps of the messages for ``max_tokens``: the
        positions of the system messages before the kept turns, where the kept turns
        start (all messages from there on are kept), and the kept messages' tokens."""
        if not self.turn_starts:  # system messages alone: all kept
            return list(self.system), len(self.messages), self.system_tokens
        budget = max_tokens - self.system_tokens
        # The turns kept are the longest run of newest turns whose tokens fit (the
        # newest at least); the tokens of the turns from turn j on only fall as j grows.
        first = bisect_left(self.tokens_before_turn, self.other_tokens - budget)
        first = min(first, len(self.turn_starts) - 1)
        start = self.turn_starts[first]
        system = self.system[: bisect_left(self.system, start)]
        kept = self.system_tokens + self.other_tokens - self.tokens_before_turn[first]
        return system, start, kept
