"""How fast the Now page answers with 1,000 steps in flight. Run by hand, not by pytest:

    AGENTRUN_VAR_DIR=/tmp/ar-now-bench .venv/bin/python bench/bench_now.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_now_bench .venv/bin/python bench/bench_now.py

Give it a database of its own: it migrates it, deletes every run in it and adds
1,000 in-flight runs over 8 workers (deciding, on a tool with a decision that
carries a 16 KB raw LLM exchange, backoff, approval, in doubt, stalled), 50
queued ones and 10,000 finished ones. Then it times, server-side through
Django's test client, the whole page, the fragment it polls every 2 s, the JSON
API and the run list's header counts. Prints medians and each one's number of queries.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/agentrun-now-bench")
os.environ.setdefault("AGENTRUN_ENQUEUE", "false")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from agentrun.engine import inflight  # noqa: E402
from agentrun.models import Run, Step  # noqa: E402
from agentrun.security.roles import create_user  # noqa: E402
from tests.base import make_in_flight  # noqa: E402

REPEAT = 20
MIX = {"deciding": 320, "acting": 512, "backoff": 80, "approval": 40, "in_doubt": 24, "stalled": 24}
WORKERS = [f"worker-{n}.example.internal:{4100 + n}" for n in range(8)]


def populate() -> None:
    Run.objects.all().delete()
    Run.objects.bulk_create(
        [
            Run(agent="scripted", status="succeeded", input={"goal": f"done {i}"})
            for i in range(10_000)
        ],
        batch_size=1000,
    )
    for state, n in MIX.items():
        leased = state in ("deciding", "acting", "stalled")
        share = n // len(WORKERS) if leased else n
        for worker in WORKERS if leased else WORKERS[:1]:
            make_in_flight(
                state, share, worker=worker, waited=5 + len(state), tools=("search", "notify")
            )
    make_in_flight("queued", 50)
    # Leases as a live worker keeps them: well ahead, however long the timing takes.
    now = timezone.now()
    Run.objects.filter(lease_expires_at__gt=now).update(lease_expires_at=now + timedelta(hours=1))
    # A real LLM step keeps the raw exchange in its decision; the page must not pay for it.
    raw = "x" * 8192
    Step.objects.filter(decided_at__isnull=False).update(
        decision={
            "thought": "act",
            "calls": [{"tool": "search", "args": {"q": "a"}}, {"tool": "notify", "args": {}}],
            "llm": {"request": raw, "response": raw},
        }
    )


def timed(label: str, call) -> None:
    """Wall time, and this process's CPU time (steadier on a busy machine; on PostgreSQL
    it leaves out the server's share)."""
    call()  # warm up
    wall, cpu, queries = [], [], 0
    for _ in range(REPEAT):
        with CaptureQueriesContext(connection) as q:
            start, start_cpu = time.perf_counter(), time.process_time()
            call()
            wall.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
        queries = len(q.captured_queries)
    print(
        f"{label:<44} median {statistics.median(wall):6.1f} ms (cpu {statistics.median(cpu):5.1f})"
        f"   max {max(wall):6.1f} ms   {queries} queries"
    )


def main() -> None:
    call_command("migrate", verbosity=0)
    populate()
    client = Client(HTTP_HOST="localhost")
    client.force_login(create_user("bench-viewer", "viewer", "bench password 1"))
    snap = inflight.snapshot()
    assert snap.counts["acting"] == MIX["acting"], snap.counts
    print(
        f"{connection.vendor}: {snap.in_flight} in flight, {snap.counts['queued']} queued, "
        f"{Run.objects.count()} runs, {len(snap.workers)} worker rows"
    )
    hx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "now-body"}

    def ok(response) -> None:
        assert response.status_code == 200, response.status_code

    timed("inflight.snapshot()", inflight.snapshot)
    timed("inflight.counts()", inflight.counts)
    timed("GET /now/ (whole page)", lambda: ok(client.get("/now/")))
    timed("GET /now/ (the polled fragment)", lambda: ok(client.get("/now/", **hx)))
    timed(
        "GET /now/?state=acting&limit=500 (fragment)",
        lambda: ok(client.get("/now/?state=acting&limit=500", **hx)),
    )
    timed("GET /api/inflight", lambda: ok(client.get("/api/inflight")))
    timed(
        "GET / (header counts fragment)",
        lambda: ok(client.get("/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="inflight-counts")),
    )
    print(
        f"page size: {len(client.get('/now/').content) // 1024} KB, "
        f"fragment {len(client.get('/now/', **hx).content) // 1024} KB"
    )


if __name__ == "__main__":
    main()
