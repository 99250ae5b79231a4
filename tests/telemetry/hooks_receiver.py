"""A webhook receiver for the tests: keeps every POST, answers with the statuses it is given."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Post:
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class HookReceiver:
    def __init__(self, *statuses: int) -> None:
        self.posts: list[Post] = []
        self._statuses = deque(statuses)  # answered in order, then 200
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    status = receiver._statuses.popleft() if receiver._statuses else 200
                    receiver.posts.append(Post(dict(self.headers.items()), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks/agentrun"

    def taken(self) -> list[Post]:
        with self._lock:
            return [p for p in self.posts if 200 <= p.answered < 300]

    def __enter__(self) -> HookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
