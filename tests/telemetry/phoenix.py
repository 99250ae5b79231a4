"""Arize Phoenix as the tests' OTLP receiver: `phoenix serve` from its own virtualenv
(`make phoenix`), started on free ports with a working folder of its own, and its spans read
back through its REST API as tests.telemetry.otlp's Span."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.telemetry.otlp import Span

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = Path(os.environ.get("AGENTRUN_PHOENIX", ROOT / ".venv-phoenix" / "bin" / "phoenix"))
STATUS = {0: "STATUS_CODE_UNSET", 1: "STATUS_CODE_OK", 2: "STATUS_CODE_ERROR"}
KIND = {"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3}


def require_phoenix() -> None:
    if PHOENIX.exists():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{PHOENIX} is missing and CI=true: run `make phoenix`")
    pytest.skip(f"{PHOENIX} is missing (`make phoenix` installs it); with CI=true, a failure")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _value(v: dict[str, Any]) -> Any:
    for kind, value in v.items():
        if value is None:
            continue
        if kind == "array_value":
            return [_value(x) for x in value.get("values") or []]
        return value
    return None


def _attrs(kvs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: _value(kv["value"]) for kv in kvs or []}


class Phoenix:
    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "phoenix.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 — closed in stop()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))},
            "PHOENIX_WORKING_DIR": str(folder),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(_free_port()),
            "PHOENIX_TELEMETRY_ENABLED": "false",
        }
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [str(PHOENIX), "serve"],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix serve exited: see {self.log_path}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise TimeoutError(f"phoenix serve did not answer in 180 s: see {self.log_path}")
        self.startup_seconds = time.monotonic() - self.started

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=30)
        response.raise_for_status()
        return response.json()

    def spans(self, project: str = "default") -> list[Span]:
        """Every span of the project, as Phoenix stored it (OTLP's JSON form)."""
        out: list[Span] = []
        cursor = ""
        while True:
            page = self.get(f"/v1/projects/{project}/spans/otlpv1?limit=1000{cursor}")
            for s in page["data"]:
                status = s.get("status") or {}
                out.append(
                    Span(
                        trace_id=s["trace_id"],
                        span_id=s["span_id"],
                        parent_id=s.get("parent_span_id") or "",
                        name=s["name"],
                        kind=KIND.get(s.get("kind") or "", 0),
                        start_ns=int(s["start_time_unix_nano"]),
                        end_ns=int(s["end_time_unix_nano"]),
                        attributes=_attrs(s.get("attributes")),
                        events=[
                            {
                                "name": e["name"],
                                "at": e.get("time_unix_nano"),
                                **_attrs(e.get("attributes")),
                            }
                            for e in s.get("events") or []
                        ],
                        links=s.get("links") or [],
                        status={
                            "code": STATUS.get(status.get("code") or 0),
                            "message": status.get("message"),
                        },
                    )
                )
            if not page.get("next_cursor"):
                return out
            cursor = f"&cursor={page['next_cursor']}"

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans() if s.trace_id == trace_id]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
