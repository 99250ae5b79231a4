"""What exporting traces costs: the same work with OTLP export on and off, in turns.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5435/ar_bench \\
        .venv/bin/python bench/bench_traces.py cpu --pairs 10 --n 1000
    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5435/ar_bench \\
    BENCH_BROKER_URL=redis://127.0.0.1:6381/0 \\
        .venv/bin/python bench/bench_traces.py llm --pairs 3 --runs 1000

`cpu`: the CPU-bound step. Each side is a fresh process that runs the bench's `workload`
agent (grow) for N steps in-process (`engine.execute_step`, each commit claiming the next
step, as bench/measure.py drives it), with traces exported or not; the sides take turns,
alternating which goes first. Per side: the median step, commit to commit, and the
process's CPU per step over all the steps and the final flush of the spans (the batch
processor's thread included: its encoding and posting are the export's cost).

`llm`: bench/llm_bench.py's 1,000 LLM-bound runs (2 workers, the default command), with
and without OTEL_EXPORTER_OTLP_ENDPOINT in the workers' environment, in turns.

The receiver is a plain HTTP server in this (parent) process that answers every OTLP post
with 200 and keeps the bodies, decoded at the end to count the spans: what a collector
costs is not agentrun's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Receiver:
    def __init__(self, port: int = 0) -> None:
        self.bodies: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> int:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        n = 0
        for body in self.bodies:
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            n += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return n


def side(n: int) -> dict[str, Any]:
    """One side, in this process: N workload steps in-process (traces per the environment)."""
    from bench import env

    env.setup()
    from django.conf import settings

    from agentrun import engine
    from agentrun.lifecycle import services
    from agentrun.telemetry import tracing
    from bench.measure import inputs

    settings.AGENTRUN_ENQUEUE = False
    env.truncate()
    run = services.start_run("workload", inputs("grow", n))
    wall: list[float] = []
    mark = [time.perf_counter()]

    def observe(outcome: engine.Outcome) -> None:
        now = time.perf_counter()
        wall.append((now - mark[0]) * 1000)
        mark[0] = now

    tracing.prepare()  # as a worker does when it starts, before the clock starts
    cpu0, wall0 = time.process_time(), time.perf_counter()
    engine.execute_step(run.pk, 1, chain=float(24 * 3600), observe=observe)
    tracing.flush()  # what is still buffered is exported before the clock stops
    cpu = (time.process_time() - cpu0) * 1000 / len(wall)
    total = (time.perf_counter() - wall0) * 1000 / len(wall)
    return {
        "traces": tracing.enabled(),
        "steps": len(wall),
        "step_ms": statistics.median(wall[:n]),
        "wall_ms_per_step": total,
        "cpu_ms_per_step": cpu,
    }


def cpu_case(args: argparse.Namespace) -> None:
    receiver = Receiver()
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(args.pairs):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        for name in order:
            environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            if name == "on":
                environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
            out = subprocess.run(
                [sys.executable, __file__, "side", "--n", str(args.n)],
                env=environ,
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            assert result["traces"] == (name == "on"), result
            results[name].append(result)
            print(name, json.dumps(result), flush=True)
    spans = receiver.spans()
    print(json.dumps({"spans_received": spans, "expected": 2 * (args.n + 1) * args.pairs}))
    report(results, ("step_ms", "wall_ms_per_step", "cpu_ms_per_step"))


def llm_case(args: argparse.Namespace) -> None:
    receiver = Receiver()
    results: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(args.pairs):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        for name in order:
            out_json = ROOT / "bench" / "out" / f"traces-llm-{name}-{i}.json"
            cmd = [
                sys.executable,
                str(ROOT / "bench" / "llm_bench.py"),
                "--runs",
                str(args.runs),
                "--workers",
                "2",
                "--no-floor",
                "--out",
                str(out_json),
            ]
            if name == "on":
                cmd += ["--env", f"OTEL_EXPORTER_OTLP_ENDPOINT={receiver.endpoint}"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            data = json.loads(out_json.read_text())
            case = [c for c in data["cases"] if c.get("runs") == args.runs][0]
            result = {
                "done_s": case["done_s"],
                "worker_cpu_ms_per_step": case["worker_cpu_s"] * 1000 / case["steps"],
                "not_succeeded": case["not_succeeded"],
                "errors": case.get("errors"),
            }
            results[name].append(result)
            print(name, json.dumps(result), flush=True)
    print(json.dumps({"spans_received": receiver.spans()}))
    report(results, ("done_s", "worker_cpu_ms_per_step"))


def report(results: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]) -> None:
    print(
        "| figure | off (median, min–max) | on | on / off (medians) | median of the pairs' ratios |"
    )
    print("|---|---|---|---|---|")
    for key in keys:
        off = [r[key] for r in results["off"] if r.get(key) is not None]
        on = [r[key] for r in results["on"] if r.get(key) is not None]
        if not off or not on:
            continue
        ratios = [b / a for a, b in zip(off, on, strict=False)]
        print(
            f"| {key} | {statistics.median(off):.3f} ({min(off):.3f}–{max(off):.3f}) "
            f"| {statistics.median(on):.3f} ({min(on):.3f}–{max(on):.3f}) "
            f"| {statistics.median(on) / statistics.median(off):.3f}× "
            f"| {statistics.median(ratios):.3f}× |"
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="case", required=True)
    c = sub.add_parser("cpu")
    c.add_argument("--pairs", type=int, default=10)
    c.add_argument("--n", type=int, default=1000)
    s = sub.add_parser("side")
    s.add_argument("--n", type=int, default=1000)
    r = sub.add_parser("receive", help="only a receiver, until killed (for other benches)")
    r.add_argument("--port", type=int, default=4319)
    llm = sub.add_parser("llm")
    llm.add_argument("--pairs", type=int, default=3)
    llm.add_argument("--runs", type=int, default=1000)
    args = p.parse_args()
    if args.case == "side":
        print(json.dumps(side(args.n)))
    elif args.case == "receive":
        receiver = Receiver(args.port)
        print(receiver.endpoint, flush=True)
        try:
            while True:
                time.sleep(10)
        except KeyboardInterrupt:
            print(json.dumps({"spans_received": receiver.spans()}))
    elif args.case == "cpu":
        cpu_case(args)
    else:
        llm_case(args)


if __name__ == "__main__":
    main()
