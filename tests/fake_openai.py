"""A local HTTP server speaking enough of the OpenAI chat-completions protocol for tests.

    with FakeOpenAI() as fake:
        fake.push(completion(tool_calls=[tool_call("echo", {"x": 1}, id="call_1")]))
        fake.push(completion("the answer"))
        fake.push(Reply(500, {"error": {"message": "overloaded"}}))
        settings.AGENTRUN_LLM_BASE_URL = fake.base_url
        ...
        fake.requests[0].json["messages"], fake.requests[0].headers["authorization"]

`POST /v1/chat/completions` answers with the next scripted reply (a completion
dict, a `Reply`, or a callable taking the `Recorded` request and returning
either). Every request is recorded, headers and arrival time included. With
nothing scripted it answers 418, so a test that makes an unexpected request
fails loudly without looking like a provider error the agent would retry.

For load tests, `FakeOpenAI(respond=callable)` answers every request the script
doesn't with that callable (called from many server threads at once: it must be
thread-safe), and `peak_in_flight` says how many requests it was answering at
the same time at most (a request is in flight from its arrival to the end of
its reply, `Reply.delay` included).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

CHAT_PATH = "/v1/chat/completions"


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    at: float = 0.0  # time.monotonic() at arrival
    peer: tuple[str, int] | None = None  # the client's address: one per connection
    target: str = ""  # the request line's target as sent (absolute through a proxy)

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    """A scripted HTTP reply. `body` is JSON-encoded unless it is str/bytes.

    `delay` sleeps before answering (for client timeouts); `drop` closes the
    connection without any answer; `hang_up` closes it after the answer without
    saying so (no `Connection: close`), as a server's idle timeout does; `chunked`
    sends the body in chunks of that many bytes (Transfer-Encoding: chunked, HTTP/1.1).
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False
    hang_up: bool = False
    chunked: int = 0


Scripted = dict[str, Any] | Reply | Callable[[Recorded], "dict[str, Any] | Reply"]


def tool_call(name: str, arguments: Any, id: str = "call_1") -> dict[str, Any]:
    """A tool call as the API returns it; dict arguments are JSON-encoded, str kept verbatim."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id, "type": "function", "function": {"name": name, "arguments": text}}


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    model: str = "fake-model",
    prompt_tokens: int | None = 11,
    completion_tokens: int | None = 7,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A chat completion with one choice. No usage block when both token counts are None."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
    }
    if prompt_tokens is not None or completion_tokens is not None:
        body["usage"] = {
            "prompt_tokens": prompt_tokens or 0,
            "completion_tokens": completion_tokens or 0,
            "total_tokens": (prompt_tokens or 0) + (completion_tokens or 0),
        }
    return body


def error(status: int, message: str, type: str = "server_error") -> Reply:
    """An error reply shaped like OpenAI's: {"error": {"message", "type", ...}}."""
    return Reply(status, {"error": {"message": message, "type": type, "param": None, "code": None}})


class _Server(ThreadingHTTPServer):
    # Hundreds of clients may connect at once: the default listen backlog (5) would
    # drop their connection attempts, which the client retries only a second later.
    request_queue_size = 1024
    daemon_threads = True


class FakeOpenAI:
    """The server; use as a context manager or call start()/stop()."""

    def __init__(
        self,
        respond: Callable[[Recorded], dict[str, Any] | Reply] | None = None,
        keep_alive: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        # keep_alive: answer in HTTP/1.1 and keep connections open (else HTTP/1.0, one
        # request per connection, as BaseHTTPRequestHandler does by default);
        # tls: a server-side context, to serve https:// on "localhost"
        self.keep_alive = keep_alive
        self.tls = tls
        self.requests: list[Recorded] = []
        self._queue: deque[Scripted] = deque()
        self._respond = respond
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """What the client takes as its base URL (the API root, ending in /v1)."""
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        if self.tls is not None:
            return f"https://localhost:{port}/v1"
        return f"http://{host}:{port}/v1"

    def push(self, *replies: Scripted) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not served yet."""
        with self._lock:
            return len(self._queue)

    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == CHAT_PATH]

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if self.keep_alive else "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                fake._handle(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                fake._handle(self, self.rfile.read(length))

        self._server = _Server(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},  # stop() waits up to one poll
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- serving ----------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        counted = [True]

        def answered() -> None:
            # Before the reply goes out: a client that has read it may send its next
            # request at once, and must not find this one still counted.
            with self._lock:
                if counted:
                    counted.clear()
                    self.in_flight -= 1

        try:
            self._answer(handler, body, answered)
        finally:
            answered()

    def _answer(
        self, handler: BaseHTTPRequestHandler, body: bytes, answered: Callable[[], None]
    ) -> None:
        path = urlsplit(handler.path).path  # a proxy's request line holds the whole URL
        recorded = Recorded(
            method=handler.command,
            path=path,
            headers={k.lower(): v for k, v in handler.headers.items()},
            body=body,
            at=time.monotonic(),
            peer=handler.client_address[:2],
            target=handler.path,
        )
        with self._lock:
            self.requests.append(recorded)
            scripted = self._queue.popleft() if path == CHAT_PATH and self._queue else None
        if scripted is None and path == CHAT_PATH:
            scripted = self._respond
        if path != CHAT_PATH or handler.command != "POST":
            reply = error(
                404, f"fake_openai: no route {handler.command} {path}", "invalid_request_error"
            )
        elif scripted is None:
            reply = error(418, "fake_openai: no scripted response left", "invalid_request_error")
        else:
            if callable(scripted):
                scripted = scripted(recorded)
            reply = scripted if isinstance(scripted, Reply) else Reply(200, scripted)
        self._send(handler, reply, answered)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, reply: Reply, answered: Callable[[], None]) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        answered()
        if reply.drop:
            handler.close_connection = True
            handler.connection.close()
            return
        body = reply.body
        if isinstance(body, str):
            data, ctype = body.encode(), "text/plain; charset=utf-8"
        elif isinstance(body, bytes):
            data, ctype = body, "application/octet-stream"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", ctype)
            if reply.chunked:
                handler.send_header("Transfer-Encoding", "chunked")
            else:
                handler.send_header("Content-Length", str(len(data)))
            handler.send_header("x-request-id", "req_fake")
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            if reply.chunked:
                for i in range(0, len(data), reply.chunked):
                    piece = data[i : i + reply.chunked]
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    handler.wfile.flush()
                handler.wfile.write(b"0\r\n\r\n")
            else:
                handler.wfile.write(data)
            if reply.hang_up:
                handler.close_connection = True
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
            pass
