"""A local OpenAI-compatible chat-completions server for bench/llm_bench.py.

    python bench/fake_llm.py --port 0 --latency 1.0 [--rate-limited 0.05 --retry-after 1]

It prints `listening on http://127.0.0.1:PORT/v1` once it accepts connections.

`POST /v1/chat/completions` answers after `--latency` seconds, as a model would that
follows one script per conversation: while the request holds fewer than `--tool-turns`
messages of role `tool`, it calls the `echo` tool ({"text": "turn N"}); then it answers
with text. So a run of the `llm` agent makes tool-turns + 1 requests. A fraction
`--rate-limited` of the requests is answered at once with HTTP 429 and `Retry-After`.

`GET /stats` returns the counters as JSON (requests, peak in flight, 429s, ...);
`POST /stats/reset` zeroes them (the peak restarts from the requests in flight).

It shares the machine's cores with the workers it serves, so it does as little as it
can: one asyncio loop, HTTP/1.1 keep-alive, a request line, Content-Length and
Connection are all it reads of the headers, and no thread per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from typing import Any

CHAT_PATH = b"/v1/chat/completions"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}


class Counters:
    def __init__(self) -> None:
        self.reset(in_flight=0)

    def reset(self, in_flight: int) -> None:
        self.in_flight = in_flight
        self.peak_in_flight = in_flight
        self.requests = 0  # chat completion requests received, 429s included
        self.tool_calls = 0
        self.answers = 0
        self.rate_limited = 0
        self.bad_requests = 0
        self.connections = 0
        self.since = time.time()

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}


class FakeLLM:
    def __init__(
        self,
        latency: float,
        tool_turns: int,
        rate_limited: float,
        retry_after: float,
        tool: str = "echo",
    ) -> None:
        self.latency = latency
        self.tool_turns = tool_turns
        self.tool = tool
        self.rate_limited = rate_limited
        self.retry_after = retry_after
        self.counters = Counters()
        self._ids = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counters.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, length, close = _parse_head(head)
                body = await reader.readexactly(length) if length > 0 else b""
                if length < 0:  # a chunked body: not worth reading for a bench client
                    status, payload, headers, close = 400, _error("send Content-Length"), {}, True
                else:
                    status, payload, headers = await self.route(method, path, body)
                writer.write(_response(status, payload, headers, close))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the client went away, or sent a head too big to be one of ours
        finally:
            writer.close()

    async def route(
        self, method: bytes, path: bytes, body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        path = path.split(b"?", 1)[0]
        if method == b"POST" and path == CHAT_PATH:
            return await self.chat(body)
        if method == b"GET" and path == b"/stats":
            return 200, self.stats(), {}
        if method == b"POST" and path == b"/stats/reset":
            self.counters.reset(in_flight=self.counters.in_flight)
            return 200, self.stats(), {}
        return 404, _error(f"no route {method.decode()} {path.decode()}"), {}

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters.as_dict(),
            "latency": self.latency,
            "tool_turns": self.tool_turns,
            "rate_limited_fraction": self.rate_limited,
        }

    async def chat(self, body: bytes) -> tuple[int, Any, dict[str, str]]:
        c = self.counters
        c.requests += 1
        if self.rate_limited and random.random() < self.rate_limited:
            c.rate_limited += 1
            return 429, _error("rate limited (fake_llm)"), {"Retry-After": f"{self.retry_after:g}"}
        try:
            messages = json.loads(body)["messages"]
            tools_seen = sum(1 for m in messages if m.get("role") == "tool")
        except (ValueError, KeyError, TypeError, AttributeError):
            c.bad_requests += 1
            return 400, _error("expected a JSON body with a messages list"), {}
        c.in_flight += 1
        c.peak_in_flight = max(c.peak_in_flight, c.in_flight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            c.in_flight -= 1
        return 200, self.completion(tools_seen, prompt_tokens=len(body) // 4), {}

    def completion(self, tools_seen: int, prompt_tokens: int) -> dict[str, Any]:
        self._ids += 1
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if tools_seen < self.tool_turns:
            self.counters.tool_calls += 1
            turn = tools_seen + 1
            args = json.dumps({"text": f"turn {turn}"} if self.tool == "echo" else {"n": turn})
            message["tool_calls"] = [
                {
                    "id": f"call_{self._ids}",
                    "type": "function",
                    "function": {"name": self.tool, "arguments": args},
                }
            ]
            finish = "tool_calls"
        else:
            self.counters.answers += 1
            message["content"] = f"Done: echo answered {tools_seen} times."
            finish = "stop"
        return {
            "id": f"chatcmpl-bench{self._ids}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "fake-llm",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 12,
                "total_tokens": prompt_tokens + 12,
            },
        }


def _parse_head(head: bytes) -> tuple[bytes, bytes, int, bool]:
    """Method, path, body length (-1: chunked) and whether to close after answering."""
    lines = head.split(b"\r\n")
    method, path, version = (lines[0].split(b" ", 2) + [b"", b""])[:3]
    length, close = 0, version.strip() == b"HTTP/1.0"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            length = -1
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    return method, path, length, close


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_llm", "param": None, "code": None}}


def _response(status: int, payload: Any, headers: dict[str, str], close: bool) -> bytes:
    data = json.dumps(payload).encode()
    head = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        f"x-request-id: req_fake_{status}",
        f"Connection: {'close' if close else 'keep-alive'}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


async def main_async(args: argparse.Namespace) -> None:
    fake = FakeLLM(args.latency, args.tool_turns, args.rate_limited, args.retry_after, args.tool)
    server = await asyncio.start_server(fake.serve, args.host, args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://{args.host}:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--latency", type=float, default=1.0, help="seconds before each answer")
    p.add_argument("--tool-turns", type=int, default=2, help="tool calls before the answer")
    p.add_argument(
        "--tool", default="echo", help='the tool to call: echo {"text"}, any other {"n": turn}'
    )
    p.add_argument("--rate-limited", type=float, default=0.0, help="fraction answered 429")
    p.add_argument("--retry-after", type=float, default=1.0, help="Retry-After of a 429, s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
