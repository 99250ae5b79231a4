"""The `llm` agent: a real LLM decides each step, over an OpenAI-compatible
chat-completions API with tool calling.

    {"goal": "Say hello through the echo tool, then tell me what it returned.",
     "tools": ["echo", "sleep"],      # optional; default: the read tools echo, sleep
     "system": "You are terse.",      # optional; "" sends no system message
     "model": "gpt-4o-mini",          # optional; default settings.AGENTRUN_LLM_MODEL
     "max_tokens_context": 8000}      # optional; history budget for truncate_history

Each `decide` sends the run's history (truncated to the budget, system
messages kept) with the run's tools as function definitions, in exactly one
request: the SDK's own retries are off, because the engine owns retries.
Tool calls become `Call(tool, args, call_id=<the model's tool call id>)`;
an answer without tool calls is the final answer.

The base URL is a deployment setting (AGENTRUN_LLM_BASE_URL), deliberately not
a run input: the API key is sent there. The key is read from the environment
at each call (AGENTRUN_LLM_API_KEY, else OPENAI_API_KEY) and never stored: the
request recorded on the decision is built here from the messages (no client
headers), and everything returned (request, response, failure details) is
scrubbed of the key and redacted.

Provider errors raise AgentError: HTTP 408/429/5xx, timeouts and connection
errors with `transient=True`, every other error with `transient=False`;
`detail` holds the status, the response body and the request id.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import math
import os
import select
import socket
import threading
import time
from collections import OrderedDict
from operator import is_
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

from agentrun.agents import (
    AgentError,
    Call,
    Decision,
    InvalidInput,
    StateAgent,
    StepContext,
    register,
)
from agentrun.builtin import llm_costs, llm_requests
from agentrun.security.redact import REDACTED, redact
from agentrun.state import AgentState, MessageWindow, message_tokens
from agentrun.tools import REGISTRY, get_tool

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

#: Environment variables holding the API key, in order of preference.
API_KEY_ENV = ("AGENTRUN_LLM_API_KEY", "OPENAI_API_KEY")
DEFAULT_TOOLS = ("echo", "sleep")
#: History budget (estimated tokens, see agentrun.state.estimate_tokens) when the input has none.
DEFAULT_CONTEXT_TOKENS = 64_000
MAX_CONTEXT_TOKENS = 10_000_000
#: The chat-completions API accepts at most 128 tools per request.
MAX_TOOLS = 128
INPUT_KEYS = ("goal", "tools", "system", "model", "max_tokens_context")
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent working towards the user's goal, one step at a time. "
    "Call the available tools when they help. When you have the answer, reply "
    "with it as plain text and call no tool."
)
#: Keys shorter than this are placeholders for servers that need none; scrubbing them
#: from text would mangle ordinary words.
_MIN_SCRUB_LENGTH = 8
_BODY_LIMIT = 4000


def api_key() -> str | None:
    """The provider API key from the environment, read at every call."""
    for name in API_KEY_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def tool_definitions(names: list[str]) -> list[dict[str, Any]]:
    """Chat-completions function definitions of the named registered tools."""
    definitions = []
    for name in names:
        t = get_tool(name)
        function: dict[str, Any] = {"name": t.name}
        if t.description:
            function["description"] = t.description
        function["parameters"] = t.parameters or {"type": "object", "properties": {}}
        definitions.append({"type": "function", "function": function})
    return definitions


_HTTP_LOCK = threading.Lock()
_TLS: tuple[int, Any] | None = None
# Each thread its own connection (and httpx client, when one is needed): one pool shared
# by hundreds of threads serialised them on its lock (httpcore assigns requests to
# connections under it, in time that grows with the requests waiting), so steps waited
# in line for their turn to wait on the model.
_LOCAL = threading.local()


def prepare() -> None:
    """Import the SDK and build the TLS settings (a worker does it as it starts)."""
    import openai  # noqa: F401

    _tls_context()


def _tls_context() -> Any:
    """The process's TLS settings, built once (~20 ms) and shared by every client."""
    import httpx2

    global _TLS
    with _HTTP_LOCK:
        if _TLS is None or _TLS[0] != os.getpid():
            _TLS = (os.getpid(), httpx2.create_ssl_context())
        return _TLS[1]


def _http(timeout: float) -> Any:
    """This thread's HTTP client (the SDK's defaults, our TLS settings) with `timeout`;
    re-created after a fork (a prefork child must not share its parent's sockets) and
    when the timeout changed."""
    import openai  # imported on first use: it costs ~1.4 s at every process start

    pid = os.getpid()
    cached = getattr(_LOCAL, "http", None)
    if cached is not None and cached[0] == (pid, timeout) and not cached[1].is_closed:
        return cached[1]
    http = openai.DefaultHttpxClient(verify=_tls_context(), timeout=timeout)
    if cached is not None and cached[0][0] == pid:
        cached[1].close()
    _LOCAL.http = ((pid, timeout), http)
    return http


def _post(key: str, base_url: str, timeout: float, content: bytes) -> str:
    """POST a chat completion request (its JSON body); the response's text, or the SDK's
    error for it.

    Sent over this thread's keep-alive connection with the standard library's HTTP
    client: the SDK's client would cost ~0.4 ms of CPU more per request (building and
    re-validating the request, its own headers), and httpx ~0.35 ms more than
    http.client (bench/profile_llm_steps.py); a worker at a thousand requests a
    second spends it on nothing. The SDK's error classes are kept, and what they
    carry. With a proxy in the environment, or a redirect, httpx sends it instead.
    """
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Accept": "application/json",
        "User-Agent": "agentrun",
    }
    if _proxies():
        return _post_httpx(url, timeout, content, headers)
    parts = urlsplit(url)
    conn_key = (os.getpid(), parts.scheme, parts.hostname, parts.port, timeout)
    conn = _connection(conn_key, parts, timeout)  # this thread's, taken: back only when whole
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", target, body=content, headers=headers)
        response = conn.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:  # timed out, refused, dropped, not HTTP
        import openai  # the SDK only for its errors: a success needs none of it

        conn.close()
        if isinstance(exc, TimeoutError):
            raise openai.APITimeoutError(request=_request(url)) from exc
        raise openai.APIConnectionError(request=_request(url)) from exc
    except BaseException:  # anything else mid-exchange (a time limit...): not reusable
        conn.close()
        raise
    if response.will_close:
        conn.close()
    else:
        _LOCAL.conn = (conn_key, conn, time.monotonic())
    status = response.status
    if 300 <= status < 400 and response.getheader("location"):
        return _post_httpx(url, timeout, content, headers)  # httpx follows it, as the SDK would
    if status >= 400:
        import httpx2

        _raise_for_status(
            httpx2.Response(
                status, headers=response.getheaders(), content=data, request=_request(url)
            )
        )
    return data.decode("utf-8", errors="replace")


def _post_httpx(url: str, timeout: float, content: bytes, headers: dict[str, str]) -> str:
    """The same request through httpx (the SDK's client): proxies, redirects."""
    import httpx2
    import openai

    http = _http(timeout)
    request = http.build_request("POST", url, content=content, headers=headers)
    try:
        response = http.send(request)
    except httpx2.TimeoutException as exc:
        raise openai.APITimeoutError(request=request) from exc
    except Exception as exc:  # refused, dropped, not HTTP... (as the SDK maps them)
        raise openai.APIConnectionError(request=request) from exc
    if response.is_error:
        _raise_for_status(response)
    return response.text


def _raise_for_status(response: Any) -> None:
    """Raise the SDK's error for an HTTP error response (an httpx Response)."""
    text = response.text.strip()
    try:
        error_body: Any = json.loads(text)
    except ValueError:
        error_body = text
    message = f"Error code: {response.status_code} - {error_body}"
    if isinstance(error_body, dict):  # the SDK's errors carry the inner object
        error_body = error_body.get("error", error_body)
    raise _status_error_class(response.status_code)(message, response=response, body=error_body)


def _request(url: str) -> Any:
    """An httpx Request for the SDK's errors, which carry one (without our headers)."""
    import httpx2

    return httpx2.Request("POST", url)


_PROXY_VARS = tuple(
    name for base in ("http_proxy", "https_proxy", "all_proxy") for name in (base, base.upper())
)


def _proxies() -> bool:
    """A proxy is set in the environment (HTTP(S)_PROXY, ALL_PROXY, either case), which
    httpx honours and http.client would not. Six lookups, not a walk of the environment
    (urllib's getproxies decodes every variable: ~45 µs a request)."""
    environ = os.environ
    return any(environ.get(name) for name in _PROXY_VARS)


#: An idle connection older than this is not reused (httpx's keep-alive expiry): servers
#: close theirs after a few seconds (5 s for many), and a NAT or balancer may drop an idle
#: flow without a word, which a reused connection would learn only at the request's timeout.
KEEPALIVE_EXPIRY = 5.0


def _connection(key: tuple[Any, ...], parts: Any, timeout: float) -> http.client.HTTPConnection:
    """This thread's keep-alive connection to the provider, taken out of its slot (`_post`
    puts it back after a whole exchange); a new one after a fork, for another host or
    timeout, when it was idle for KEEPALIVE_EXPIRY, or when the server closed it (a
    readable idle socket means it did: at EOF, or sent what nobody asked for)."""
    cached = getattr(_LOCAL, "conn", None)
    _LOCAL.conn = None
    if cached is not None:
        old_key, conn, used = cached
        if (
            old_key == key
            and conn.sock is not None
            and time.monotonic() - used < KEEPALIVE_EXPIRY
            and not _readable(conn.sock)
        ):
            return conn
        if old_key[0] == os.getpid():  # (a forked child leaves its parent's socket alone)
            conn.close()
    host = parts.hostname or ""
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            host, parts.port or 443, timeout=timeout, context=_tls_context()
        )
    # The port always given: http.client would read "::1" as host ":" and port 1.
    return http.client.HTTPConnection(host, parts.port or 80, timeout=timeout)


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()  # not select(): a worker's descriptors pass 1024
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed under us
        return True


def _status_error_class(status: int) -> type[openai.APIStatusError]:
    """The SDK's class for an HTTP error status, as its own client picks it."""
    import openai

    by_status = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        409: openai.ConflictError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    return (
        openai.InternalServerError
        if status >= 500
        else by_status.get(status, openai.APIStatusError)
    )


_SLOTS: tuple[int, int, threading.BoundedSemaphore] | None = None


def _request_slots() -> threading.BoundedSemaphore:
    """The process's cap on requests in flight (AGENTRUN_LLM_MAX_CONCURRENCY)."""
    global _SLOTS
    size = max(int(settings.AGENTRUN_LLM_MAX_CONCURRENCY), 1)
    with _HTTP_LOCK:
        if _SLOTS is None or _SLOTS[0] != os.getpid() or _SLOTS[1] != size:
            _SLOTS = (os.getpid(), size, threading.BoundedSemaphore(size))
        return _SLOTS[2]


def retry_after_seconds(headers: Any) -> float | None:
    """How long a provider asked us to wait: `retry-after-ms`, else `Retry-After`
    in seconds or as an HTTP date. None when it said nothing usable."""
    try:
        ms = headers.get("retry-after-ms")
        if ms:
            seconds = float(ms) / 1000  # float() accepts "nan" and "inf": neither is a wait
            return max(seconds, 0.0) if math.isfinite(seconds) else None
        value = (headers.get("retry-after") or "").strip()
        if not value:
            return None
        if value.replace(".", "", 1).isdigit():
            return float(value)
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max((when - datetime.datetime.now(datetime.UTC)).total_seconds(), 0.0)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _public_url(url: str) -> str:
    """The URL without user info, query or fragment (they may carry credentials)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _scrub(value: Any, secret: str | None) -> Any:
    """Replace every occurrence of `secret` in the strings of a JSON-like value."""
    if not secret or len(secret) < _MIN_SCRUB_LENGTH:
        return value
    if isinstance(value, str):
        return value.replace(secret, REDACTED) if secret in value else value
    if isinstance(value, dict):
        return {k: _scrub(v, secret) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secret) for v in value]
    return value


def _clean(value: Any, secret: str | None) -> Any:
    return redact(_scrub(value, secret))


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clean_cut(text: str, secret: str | None, limit: int) -> str:
    """The provider's text with the key and other secrets taken out, then cut to `limit`:
    in that order, since a key cut in two is no longer one that scrubbing can find."""
    cleaned: str = _clean(text, secret)
    return cleaned[:limit]


def _body_message(body: Any, text: str) -> str:
    """The human part of a provider error body ({"error": {"message": ...}} or text)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return body["message"]
    return text.strip()


def _is_transient_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


# Each run's message window as of its last decision in this process (LLMAgent._window),
# with the history it was made of; newest last, bounded by the bytes of the messages'
# JSON to an eighth of the state cache's budget (which counts a state as 8 times its
# JSON): about the conversations of the runs whose states the process keeps.
_WINDOWS: OrderedDict[str, tuple[list[dict[str, Any]], MessageWindow, int]] = OrderedDict()
_WINDOWS_LOCK = threading.Lock()
_windows_bytes = 0  # the JSON of the windows in _WINDOWS, as counted when put there


def _take_window(run_id: str) -> tuple[list[dict[str, Any]], MessageWindow] | None:
    global _windows_bytes
    with _WINDOWS_LOCK:
        entry = _WINDOWS.pop(run_id, None)
        if entry is not None:
            _windows_bytes -= entry[2]
    return None if entry is None else entry[:2]


def _put_window(run_id: str, history: list[dict[str, Any]], window: MessageWindow) -> None:
    global _windows_bytes
    budget = settings.AGENTRUN_STATE_CACHE_MB * 1024 * 1024 // 8
    if window.size > budget:
        return
    with _WINDOWS_LOCK:
        old = _WINDOWS.pop(run_id, None)
        _windows_bytes += window.size - (old[2] if old else 0)
        _WINDOWS[run_id] = (history, window, window.size)
        while _windows_bytes > budget:
            _windows_bytes -= _WINDOWS.popitem(last=False)[1][2]


@register
class LLMAgent(StateAgent):
    """An LLM picks each step's tool calls or final answer (chat completions)."""

    name = "llm"
    description = "A real LLM over an OpenAI-compatible chat-completions API with tool calling."
    # The tools are chosen per run (input "tools"); decide() enforces them.
    tools = ()
    system_prompt = DEFAULT_SYSTEM_PROMPT

    # ---- input and state ---------------------------------------------------

    def validate_input(self, input: Any) -> None:
        super().validate_input(input)
        unknown = sorted(set(input) - set(INPUT_KEYS))
        if unknown:
            raise InvalidInput(
                f"unknown key(s) {', '.join(map(str, unknown))} (allowed: {', '.join(INPUT_KEYS)})"
            )
        goal = input.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            got = "an empty string" if isinstance(goal, str) else _json_type(goal)
            raise InvalidInput(f"goal must be a non-empty string, got {got}")
        tools = input.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise InvalidInput(f"tools must be a list of tool names, got {_json_type(tools)}")
            if len(tools) > MAX_TOOLS:
                raise InvalidInput(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}")
            for i, name in enumerate(tools):
                if not isinstance(name, str):
                    raise InvalidInput(
                        f"tools[{i}] must be a tool name (string), got {_json_type(name)}"
                    )
                if name not in REGISTRY:
                    known = ", ".join(sorted(REGISTRY))
                    raise InvalidInput(f"tools[{i}]: unknown tool {name!r} (known: {known})")
                if name in tools[:i]:
                    raise InvalidInput(f"tools[{i}]: tool {name!r} is listed twice")
        system = input.get("system")
        if system is not None and not isinstance(system, str):
            raise InvalidInput(f"system must be a string, got {_json_type(system)}")
        model = input.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            got = "an empty string" if isinstance(model, str) else _json_type(model)
            raise InvalidInput(f"model must be a non-empty string, got {got}")
        budget = input.get("max_tokens_context")
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int):
                raise InvalidInput(
                    f"max_tokens_context must be an integer, got {_json_type(budget)}"
                )
            if not 1 <= budget <= MAX_CONTEXT_TOKENS:
                raise InvalidInput(
                    f"max_tokens_context must be between 1 and {MAX_CONTEXT_TOKENS}, got {budget}"
                )

    def initial_state(self, input: dict[str, Any]) -> dict[str, Any]:
        state = AgentState()
        goal = str(input.get("goal", ""))
        state.memory = {"goal": goal, "plan": [], "completed": [], "notes": {}}
        system = input.get("system")
        if system is None:
            system = self.system_prompt
        if system:
            state.add_message("system", system)
        state.add_message("user", goal)
        return state.to_dict()

    # ---- deciding ----------------------------------------------------------

    def decide(self, state: dict[str, Any], ctx: StepContext) -> Decision:
        inp = ctx.input
        model = inp.get("model") or settings.AGENTRUN_LLM_MODEL
        names = list(DEFAULT_TOOLS if inp.get("tools") is None else inp["tools"])
        budget = inp.get("max_tokens_context") or DEFAULT_CONTEXT_TOKENS
        base_url = settings.AGENTRUN_LLM_BASE_URL
        timeout = float(settings.AGENTRUN_LLM_TIMEOUT)

        window = self._window(ctx.run_id, state)
        system, start, tokens_sent = window.fit(budget)
        sent = llm_requests.ranges(system)
        if start < len(window):
            if sent and sent[-1][1] == start:
                sent[-1][1] = len(window)
            else:
                sent.append([start, len(window)])
        encoded = window.texts
        messages = [encoded[i] for i in system] + encoded[start:]
        try:
            tools = tool_definitions(names)
        except KeyError as exc:  # the run's input named a tool that has since gone away
            raise AgentError(f"this run's tools: {exc.args[0]}", detail={"tools": names}) from None
        where = {"model": model, "base_url": _public_url(base_url)}

        key = api_key()
        if key is None:
            raise AgentError(
                f"no API key for the LLM provider: set {API_KEY_ENV[0]} (or {API_KEY_ENV[1]})",
                detail=where,
            )
        if not key.isprintable() or any(c.isspace() for c in key):
            # It would not fit in a header: the HTTP client's error would quote it.
            raise AgentError(
                f"the API key for the LLM provider ({API_KEY_ENV[0]} or {API_KEY_ENV[1]})"
                " holds a space or a control character",
                detail=where,
            )
        content = llm_requests.join(model, messages, tools)
        queued = time.perf_counter()
        with _request_slots():
            started = time.perf_counter()
            try:
                body_text = _post(key, base_url, timeout, content)
            except Exception as exc:
                import openai

                if not isinstance(exc, openai.OpenAIError):
                    raise
                raise _provider_error(exc, key=key, timeout=timeout, where=where) from None
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        queued_ms = round((started - queued) * 1000, 3)

        try:
            response = json.loads(body_text)
        except ValueError:
            raise AgentError(
                f"the LLM provider's response is not JSON ({where['base_url']}, {model})",
                detail={**_clean(where, key), "body": _clean_cut(body_text, key, _BODY_LIMIT)},
            ) from None
        if not isinstance(response, dict):
            raise AgentError(
                f"the LLM provider's response is a JSON {_json_type(response)}, not an object"
                f" ({where['base_url']}, {model})",
                detail={**_clean(where, key), "body": _clean_cut(body_text, key, _BODY_LIMIT)},
            )
        # The response is redacted here, not only with the whole decision in the engine:
        # the decision's words quote the model's arguments cut short ("call echo
        # {"password": "hun…"), and a cut secret is no longer one that redaction can
        # recognise. The request's messages are quoted nowhere: the engine's redaction of
        # the decision covers them (a walk of the whole history less a step); only the
        # key itself, which no pattern knows, is replaced here.
        response = _clean(response, key)
        # The request as a reference into the run's history (llm_requests): the messages
        # are in the state already; the decision names which were sent.
        request = llm_requests.reference(
            run_id=ctx.run_id,
            model=model,
            names=names,
            definitions=tools,
            history_len=len(window),
            sent=sent,
        )
        decision = self._decision(response, model=model, names=names, where=where)
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        llm: dict[str, Any] = {
            "model": model,
            "base_url": where["base_url"],
            "request": request,
            "response": response,
            "tokens_in": tokens_in if isinstance(tokens_in, int) else 0,
            "tokens_out": tokens_out if isinstance(tokens_out, int) else 0,
            "latency_ms": latency_ms,
        }
        if queued_ms >= 1:  # waited for one of the process's request slots
            llm["queued_ms"] = queued_ms
        if not (isinstance(tokens_in, int) and isinstance(tokens_out, int)):
            # No usage from the provider: record the local estimate and say so.
            llm["tokens_in"] = tokens_sent
            llm["tokens_out"] = message_tokens(_first_message(response) or {})
            llm["tokens_estimated"] = True
        if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0:
            llm["tokens_cached"] = min(cached, llm["tokens_in"])
        price = llm_costs.cost(
            model, llm["tokens_in"], llm["tokens_out"], llm.get("tokens_cached", 0)
        )
        if price is not None:
            llm["cost_usd"] = price
        decision.llm = llm
        log.debug(
            "llm %s step %s of %s: %s, %s tokens in, %s out, %.0f ms",
            model,
            ctx.step,
            ctx.run_id,
            decision.rationale,
            llm["tokens_in"],
            llm["tokens_out"],
            latency_ms,
        )
        return decision

    def _window(self, run_id: str, state: dict[str, Any]) -> MessageWindow:
        """The run's history as chat messages with their token counts and JSON: this
        process's window of the run's previous decision, extended by what the history
        gained since, when the history still starts with the very messages it was made
        of (a state's messages are never changed in place, only appended: the engine's
        identity shortcuts rest on that too); else made anew from the whole history."""
        history = self.load(state).history
        if type(self).load is not StateAgent.load:  # a subclass's own view of the state
            return MessageWindow(history)
        cached = _take_window(run_id)
        window = None
        if cached is not None:
            old, window = cached
            if len(history) >= len(old) and all(map(is_, history, old)):
                window.extend(history[len(old) :])
            else:
                window = None
        if window is None:
            window = MessageWindow(history)
        _put_window(run_id, history, window)
        return window

    def _decision(
        self, response: dict[str, Any], *, model: str, names: list[str], where: dict[str, Any]
    ) -> Decision:
        """Turn a (scrubbed, redacted) chat completion into a Decision."""

        def fail(message: str, **detail: Any) -> AgentError:
            return AgentError(message, detail={**where, **detail, "response": response})

        if "choices" not in response and "error" in response:
            raise fail(f"LLM provider error ({model}): {_short(_body_message(response, ''), 300)}")
        message = _first_message(response)
        if message is None:
            raise fail(f"the LLM provider's response has no choices[0].message ({model})")
        choice = response["choices"][0]
        finish_reason = choice.get("finish_reason")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise fail(
                f"model {model} returned content of type {_json_type(content)}, not a string",
                raw=content,
            )
        tool_calls = message.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise fail(f"model {model} returned tool_calls that are not a list", raw=tool_calls)

        calls = [
            self._call(tc, i, model=model, names=names, fail=fail)
            for i, tc in enumerate(tool_calls)
        ]
        text = (content or "").strip()
        if calls:
            described = ", ".join(f"{c.tool} {_short(json.dumps(c.args), 60)}" for c in calls)
            return Decision(
                thought=text or f"call {described}",
                rationale=f"model {model} chose to call {', '.join(c.tool for c in calls)}",
                calls=calls,
            )
        note = f" (finish_reason={finish_reason})" if finish_reason not in (None, "stop") else ""
        if text:
            return Decision(
                thought=text, rationale=f"model {model} chose to answer{note}", final=content
            )
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal.strip():
            return Decision(
                thought=refusal, rationale=f"model {model} chose to refuse{note}", final=refusal
            )
        raise fail(
            f"model {model} returned neither tool calls nor an answer"
            f" (finish_reason={finish_reason})",
            raw=message,
        )

    def _call(self, tc: Any, i: int, *, model: str, names: list[str], fail: Any) -> Call:
        """One tool call of the completion as a Call; AgentError if it can't be run."""
        function = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(function, dict) or tc.get("type", "function") != "function":
            raise fail(
                f"model {model} returned tool_calls[{i}] that is not a function call", raw=tc
            )
        name = function.get("name")
        call_id = tc.get("id") if isinstance(tc.get("id"), str) and tc.get("id") else None
        if name not in names:
            known = "unknown tool" if name not in REGISTRY else "a tool not given to this run"
            raise fail(
                f"model {model} asked for {known} {name!r} (this run's tools: "
                f"{', '.join(names) or 'none'})",
                raw=tc,
                tool_call_id=call_id,
            )
        arguments = function.get("arguments")
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            args: Any = {}
        elif isinstance(arguments, dict):  # some compatible servers send an object
            args = arguments
        elif isinstance(arguments, str):
            try:
                args = json.loads(arguments)
            except ValueError as exc:
                raise fail(
                    f"model {model} sent malformed JSON arguments for {name}: {exc}",
                    raw=arguments,
                    tool=name,
                    tool_call_id=call_id,
                ) from None
        else:
            args = arguments
        if not isinstance(args, dict):
            raise fail(
                f"model {model} sent arguments for {name} that are a JSON {_json_type(args)}, "
                "not an object",
                raw=arguments,
                tool=name,
                tool_call_id=call_id,
            )
        problem = get_tool(name).check_args(args)
        if problem:
            raise fail(
                f"model {model} sent arguments that don't fit {name}: {problem}",
                raw=arguments,
                tool=name,
                tool_call_id=call_id,
            )
        return Call(name, args, call_id=call_id)


def _first_message(response: Any) -> dict[str, Any] | None:
    choices = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _provider_error(
    exc: openai.OpenAIError, *, key: str, timeout: float, where: dict[str, Any]
) -> AgentError:
    """An AgentError for a failed request; transient when a later attempt may succeed.

    Only the status, the response body and the request id are kept: never the
    request (its headers carry the key).
    """
    import openai

    model, base = where["model"], where["base_url"]
    detail: dict[str, Any] = {**where, "provider_error": type(exc).__name__}
    wait: float | None = None
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        try:
            text = exc.response.text
        except Exception:  # noqa: BLE001 -- a body we can't read is not worth another error
            text = ""
        transient = _is_transient_status(status)
        detail.update(
            status=status, body=_clean_cut(text, key, _BODY_LIMIT), request_id=exc.request_id
        )
        retry_after = exc.response.headers.get("retry-after")
        if retry_after:
            detail["retry_after"] = retry_after
        if transient:
            wait = retry_after_seconds(exc.response.headers)
        said = _short(_clean(_body_message(exc.body, text), key), 300)
        message = f"LLM provider error: HTTP {status} from {base} ({model})" + (
            f": {said}" if said else ""
        )
    elif isinstance(exc, openai.APITimeoutError):
        transient = True
        detail["timeout_s"] = timeout
        message = f"LLM provider timed out after {timeout:g}s ({base}, {model})"
    elif isinstance(exc, openai.APIConnectionError):
        transient = True
        cause = exc.__cause__ or exc.__context__
        reason = f"{type(cause).__name__}: {cause}" if cause else str(exc)
        detail["reason"] = reason
        message = f"could not connect to the LLM provider at {base} ({model}): {reason}"
    else:  # a response that doesn't fit the API, a client misconfiguration...
        transient = False
        message = f"LLM provider error ({base}, {model}): {type(exc).__name__}: {exc}"
    detail["transient"] = transient
    return AgentError(
        _scrub(message, key), transient=transient, detail=_clean(detail, key), retry_after=wait
    )
