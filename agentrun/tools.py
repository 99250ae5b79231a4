"""Declaring tools an agent can call.

    from agentrun.tools import tool, ToolContext

    @tool(kind="write", idempotent=True)
    def charge(ctx: ToolContext, amount: float) -> dict:
        return payments.charge(amount, idempotency_key=ctx.idempotency_key)

Kinds: "read" tools have no side effects (their results are cached within a
run by (tool, args)); "write" tools change the world; "hybrid" tools change
it in a way that can be undone by their `compensate=` function, which runs on
cancel and on terminal failure, in reverse order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

ToolKind = Literal["read", "write", "hybrid"]
KINDS = ("read", "write", "hybrid")


class ToolError(Exception):
    """A tool failed. `transient=True` errors are retried with backoff."""

    transient = False

    def __init__(self, message: str, *, transient: bool | None = None):
        super().__init__(message)
        if transient is not None:
            self.transient = transient


class TransientToolError(ToolError):
    """A failure worth retrying: a timeout, a 503, a dropped connection."""

    transient = True


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: delay = min(initial * factor**(attempt-1), maximum)."""

    max_attempts: int = 4
    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0

    def delay(self, attempt: int) -> float:
        return min(self.initial * self.factor ** max(attempt - 1, 0), self.maximum)


@dataclass
class ToolContext:
    """What a tool gets besides its arguments."""

    run_id: str
    step: int
    call_index: int
    idempotency_key: str
    attempt: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tool:
    name: str
    fn: Callable[..., Any]
    kind: ToolKind
    description: str = ""
    idempotent: bool = False
    requires_approval: bool = False
    timeout: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    compensate: Callable[..., Any] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    cache: bool = True

    def __call__(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        return self.fn(ctx, **args)

    def _params(self) -> list[inspect.Parameter]:
        """The function's parameters after ctx (worked out once: checked at every step)."""
        cached = self.__dict__.get("_params_cache")
        if cached is None:
            cached = list(inspect.signature(self.fn).parameters.values())[1:]
            self.__dict__["_params_cache"] = cached
        return cached

    def check_args(self, args: Any) -> str | None:
        """A reason why `args` can't be passed to this tool, or None."""
        if not isinstance(args, dict):
            return "args must be an object"
        params = self._params()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        names = {p.name for p in params}
        unknown = sorted(set(args) - names)
        if unknown:
            return f"unknown argument(s) {', '.join(unknown)}"
        missing = [p.name for p in params if p.default is p.empty and p.name not in args]
        if missing:
            return f"missing argument(s) {', '.join(missing)}"
        return None


REGISTRY: dict[str, Tool] = {}


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    kind: ToolKind = "read",
    idempotent: bool | None = None,
    requires_approval: bool = False,
    timeout: float = 60.0,
    retry: RetryPolicy | None = None,
    compensate: Callable[..., Any] | None = None,
    parameters: dict[str, Any] | None = None,
    cache: bool = True,
) -> Any:
    """Register a function as a tool. The function takes a ToolContext first.

    - kind: "read" | "write" | "hybrid"; a hybrid needs `compensate=`, a
      function `(ctx, args, result)` that undoes it and is itself idempotent.
    - idempotent: the tool honours `ctx.idempotency_key` (reads are always
      idempotent). A non-idempotent write left "in doubt" by a crash is never
      retried automatically; the run waits for an operator.
    - requires_approval: pause the run for an operator before every call.
    - timeout (seconds), retry: a RetryPolicy for transient errors.
    - parameters: JSON Schema of the arguments, for LLM tool calling.
    - cache: a read tool's result is reused within a run for the same
      arguments; pass False for reads of data that changes (a cart, a clock).
    """

    def register(f: Callable[..., Any]) -> Tool:
        if kind not in KINDS:
            raise ValueError(f"tool kind must be one of {KINDS}, not {kind!r}")
        if kind == "hybrid" and compensate is None:
            raise ValueError(f"hybrid tool {f.__name__} needs compensate=")
        t = Tool(
            name=name or f.__name__,
            fn=f,
            kind=kind,
            description=inspect.getdoc(f) or "",
            idempotent=(kind == "read") if idempotent is None else idempotent,
            requires_approval=requires_approval,
            timeout=timeout,
            retry=retry or RetryPolicy(),
            compensate=compensate,
            parameters=parameters or {"type": "object", "properties": {}},
            cache=cache,
        )
        REGISTRY[t.name] = t
        return t

    return register(fn) if fn is not None else register


def get_tool(name: str) -> Tool:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown tool {name!r}") from None
