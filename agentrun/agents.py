"""Defining agents: a policy that decides the next action, plus its tools.

    from agentrun.agents import StateAgent, Decision, Call, register

    @register
    class Researcher(StateAgent):
        name = "researcher"
        tools = ("search", "write_report")

        def decide(self, state, ctx):
            ...
            return Decision(thought="look it up", calls=[Call("search", {"q": goal})])

The engine calls `decide` once per step (its result is persisted before any
tool runs and reused if the step is retried), runs the requested tool calls,
then `update` folds the results into the next state. State is plain JSON
between steps; `StateAgent` works on the typed `AgentState`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrun.state import AgentState, Phase, validate_successor


class InvalidInput(ValueError):
    """The run input does not fit the agent; the message says where."""


class AgentError(Exception):
    """The policy could not decide (bad LLM output, provider error, ...)."""

    transient = False

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        detail: Any = None,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.transient = transient
        self.detail = detail
        #: Seconds the provider asked us to wait before trying again (HTTP Retry-After).
        self.retry_after = retry_after


@dataclass
class Call:
    """One tool call requested by a decision."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    approval: bool = False
    fault: str | None = None
    call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"tool": self.tool, "args": self.args}
        if self.approval:
            d["approval"] = True
        if self.fault:
            d["fault"] = self.fault
        if self.call_id:
            d["call_id"] = self.call_id
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Call:
        return cls(
            tool=d["tool"],
            args=d.get("args") or {},
            approval=bool(d.get("approval")),
            fault=d.get("fault"),
            call_id=d.get("call_id"),
        )


@dataclass
class Decision:
    """What the policy decided at one step: tool calls, or a final answer.

    `llm` holds the raw request/response, token counts and latency when an
    LLM made the decision.
    """

    thought: str = ""
    rationale: str = ""
    calls: list[Call] = field(default_factory=list)
    final: str | None = None
    llm: dict[str, Any] | None = None
    #: More of what the agent decided, stored with the decision under keys of its own
    #: (an integration's record of the step; a recorded fork's provenance).
    extra: dict[str, Any] = field(default_factory=dict)
    #: A framework's own record of the step, in its own format (`Step.checkpoint`,
    #: agentrun.store.checkpoints): stored with the decision, never shown nor redacted,
    #: and not part of `to_dict`.
    checkpoint: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            **self.extra,
            "thought": self.thought,
            "rationale": self.rationale,
            "calls": [c.to_dict() for c in self.calls],
            "final": self.final,
        }
        if self.llm is not None:
            d["llm"] = self.llm
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        return cls(
            thought=d.get("thought", ""),
            rationale=d.get("rationale", ""),
            calls=[Call.from_dict(c) for c in d.get("calls") or []],
            final=d.get("final"),
            llm=d.get("llm"),
            extra={k: v for k, v in d.items() if k not in _DECISION_KEYS},
        )


_DECISION_KEYS = frozenset(("thought", "rationale", "calls", "final", "llm"))


@dataclass
class CallResult:
    """The outcome of one tool call, as `update` sees it."""

    index: int
    tool: str
    kind: str
    args: dict[str, Any]
    status: str
    result: Any = None
    error: str | None = None
    attempts: int = 1
    call_id: str | None = None


@dataclass
class StepContext:
    run_id: str
    step: int
    input: dict[str, Any]
    first_step: int = 1


class Agent:
    """Base class: subclass, set `name` and `tools`, implement the three methods."""

    name: str = ""
    description: str = ""
    tools: tuple[str, ...] = ()
    #: A recorded fork of this agent's runs reuses the parent's decisions while the
    #: states match (False: the agent replays its parent's record itself).
    replays_decisions: bool = True

    @property
    def version(self) -> str:
        """A hash of the agent's source, so a run records which code it ran."""
        module = sys.modules[type(self).__module__]
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            source = type(self).__qualname__
        return hashlib.sha256(source.encode()).hexdigest()[:12]

    def validate_input(self, input: Any) -> None:
        """Raise InvalidInput with a precise message if `input` can't be run."""
        if not isinstance(input, dict):
            raise InvalidInput("input must be a JSON object")

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        raise NotImplementedError

    def update(
        self, state: dict[str, Any], decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> dict[str, Any]:
        raise NotImplementedError

    def fail(
        self, state: dict[str, Any], failure: dict[str, Any], ctx: StepContext
    ) -> dict[str, Any]:
        """The state after a step failed for good; keeps the failure context."""
        return {
            **state,
            "error": failure.get("message"),
            "failures": [*state.get("failures", []), failure],
        }

    def validate_state(self, state: Any) -> None:
        """Raise ValueError (with the path) if `state` is not a valid state."""
        if not isinstance(state, dict):
            raise ValueError("state must be a JSON object")

    def run_id(self, input: dict[str, Any]) -> Any:
        """The id a new run of this input gets, or None for a fresh one (optional hook:
        an integration whose runs are found by an id of their own)."""
        return None

    def fork_input(
        self, parent: Any, step: int, at: str, state: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """A fork's input and the labels it has besides its parent's (optional hook), for a
        fork of run `parent` from the (step, at) snapshot with `state` (edited or not).
        Raise ValueError to refuse the fork. The default: the parent's input, no labels."""
        return parent.input, {}

    def summary(self, input: dict[str, Any]) -> str:
        """What a run is about, in one line, for the run list and the run page (optional
        hook). The default: the input's `goal`, else its first text field (`word: lease`).
        The pages redact the input before calling it and cut the answer at 300 characters."""
        return input_summary(input)


SUMMARY_CHARS = 300


def input_summary(input: Any) -> str:
    """A run's input in one line: its `goal`, else its first text field as `key: value`
    (else its first field). PostgreSQL keeps an input's keys in an order of its own."""
    if not isinstance(input, dict) or not input:
        return ""
    goal = input.get("goal")
    if isinstance(goal, str) and goal.strip():
        return goal
    texts = [(k, v) for k, v in input.items() if isinstance(v, str) and v.strip()]
    key, value = texts[0] if texts else next(iter(input.items()))
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return f"{key}: {text[:SUMMARY_CHARS]}"


class StateAgent(Agent):
    """An agent whose state is the typed AgentState (history, memory, log...)."""

    system_prompt = ""

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        state = AgentState()
        goal = str(input.get("goal", ""))
        state.memory = {"goal": goal, "plan": [], "completed": [], "notes": {}}
        if self.system_prompt:
            state.add_message("system", self.system_prompt)
        state.add_message("user", goal)
        return state.to_dict()

    def validate_state(self, state: Any) -> None:
        base = _TYPED.base_of(state)
        if base is None:
            AgentState.from_dict(state)
        else:  # a state this agent's update made: check what the step added
            validate_successor(base, state)
            _TYPED.checked(state)

    def load(self, state: dict[str, Any]) -> AgentState:
        if _TYPED.is_checked(state):
            return AgentState.from_valid(state)
        return AgentState.from_dict(state)

    def _load_for_update(self, state: dict[str, Any]) -> AgentState:
        """The typed state `state` was made from, taken over (no rebuild, no walk over
        the run's history), when this process's last update made `state` and it has
        been checked since; else `load(state)`."""
        if type(self).load is StateAgent.load:
            st = _TYPED.take(state)
            if st is not None:
                return st
        return self.load(state)

    def update(
        self, state: dict[str, Any], decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> dict[str, Any]:
        st = self._load_for_update(state)
        if st.phase in (Phase.IDLE, Phase.REFLECTING, Phase.WAITING):
            st.to(Phase.PLANNING)
        st.iteration = ctx.step
        action = "final" if decision.final is not None else ("tools" if decision.calls else "think")
        st.record_decision(
            step=ctx.step, thought=decision.thought, rationale=decision.rationale, action=action
        )
        assistant: dict[str, Any] = {}
        if decision.calls:
            assistant["tool_calls"] = [
                {
                    "id": r.call_id or f"call_{ctx.step}_{r.index}",
                    "type": "function",
                    "function": {"name": r.tool, "arguments": _as_text(r.args)},
                }
                for r in results
            ]
        st.add_message(
            "assistant", decision.thought if decision.final is None else decision.final, **assistant
        )
        if results:
            st.to(Phase.EXECUTING)
        for r in results:
            st.record_tool_call(
                step=ctx.step,
                index=r.index,
                tool=r.tool,
                kind=r.kind,
                args=r.args,
                status=r.status,
                result=r.result,
                attempts=r.attempts,
            )
            st.add_message(
                "tool",
                _as_text(r.result if r.error is None else {"error": r.error}),
                tool_call_id=r.call_id or f"call_{ctx.step}_{r.index}",
                name=r.tool,
            )
        self.observe(st, decision, results, ctx)
        if decision.final is not None:
            st.finish(decision.final)
        else:
            st.to(Phase.REFLECTING)
        out = st.to_dict()
        if decision.final is None:  # a final answer ends the run: no next step takes it over
            _TYPED.put(out, state, st)
        return out

    def observe(
        self, st: AgentState, decision: Decision, results: list[CallResult], ctx: StepContext
    ) -> None:
        """Hook: fold tool results into memory (notes, plan progress)."""

    def fail(
        self, state: dict[str, Any], failure: dict[str, Any], ctx: StepContext
    ) -> dict[str, Any]:
        st = self.load(state)
        st.record_failure(**failure)
        if st.phase not in (Phase.DONE, Phase.ERROR):
            st.fail(failure.get("message") or "failed")
        return st.to_dict()


class _TypedStates:
    """The states this process's StateAgents' updates returned, by identity, each with the
    typed state that made it and the (valid) state it was made from.

    The engine hands a step's post state to the next step as the same object, so the
    next update takes the typed state over instead of rebuilding it from the dict, and
    validate_state checks only what a step added: a step costs what it changes, not
    the size of the state. Taking an entry removes it, so a typed state is reused once;
    a miss (another process, an evicted entry, an edited state) is the full rebuild.
    """

    # Entries of runs in flight in this process (the engine's state cache holds the same
    # states); a run that stops elsewhere leaves one entry until it is pushed out.
    MAX = 128

    def __init__(self) -> None:
        self._entries: OrderedDict[int, list[Any]] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, state: Any) -> list[Any] | None:
        entry = self._entries.get(id(state))
        return entry if entry is not None and entry[0] is state else None

    def put(self, out: dict[str, Any], base: dict[str, Any], st: AgentState) -> None:
        with self._lock:
            self._entries[id(out)] = [out, base, st, False]
            self._entries.move_to_end(id(out))
            while len(self._entries) > self.MAX:
                self._entries.popitem(last=False)

    def base_of(self, state: Any) -> dict[str, Any] | None:
        with self._lock:
            entry = self._get(state)
            return None if entry is None else entry[1]

    def checked(self, state: Any) -> None:
        with self._lock:
            entry = self._get(state)
            if entry is not None:
                entry[3] = True

    def is_checked(self, state: Any) -> bool:
        with self._lock:
            entry = self._get(state)
            return entry is not None and entry[3]

    def take(self, state: Any) -> AgentState | None:
        with self._lock:
            entry = self._get(state)
            if entry is None or not entry[3]:
                return None
            del self._entries[id(state)]
            return entry[2]


_TYPED = _TypedStates()


def _as_text(value: Any) -> str:
    """JSON text with sorted keys: the database may hand back objects in another key
    order (jsonb does), and a retried or replayed step must build the same state."""
    import json

    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


AGENTS: dict[str, Agent] = {}


def register(cls: type[Agent]) -> type[Agent]:
    """Class decorator: make an agent available by its `name`."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a name")
    AGENTS[cls.name] = cls()
    return cls


def get_agent(name: str) -> Agent:
    try:
        return AGENTS[name]
    except KeyError:
        known = ", ".join(sorted(AGENTS))
        hint = _UNREGISTERED_HINTS.get(name, "")
        raise InvalidInput(f"unknown agent {name!r} (known: {known}){hint}") from None


# What to do about an agent that is not registered in this process, when it has a say.
_UNREGISTERED_HINTS = {
    "langgraph": (
        ": a LangGraph thread is forked or started here only when its graph is named in"
        " AGENTRUN_LANGGRAPH_GRAPHS (module:attribute of the compiled graph)"
    ),
}
