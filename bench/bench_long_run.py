"""The run page, search and the run API at 10,000 steps. Run by hand, not by pytest:

    /work/main/.venv/bin/python bench/bench_long_run.py                 # flat, 10,000 steps
    /work/main/.venv/bin/python bench/bench_long_run.py --variants flat,grow --grow-steps 2000
    /work/main/.venv/bin/python bench/bench_long_run.py --compare /work/main   # also main's pages

Needs PostgreSQL on 127.0.0.1:5432 and /usr/bin/chromium. It uses a database of its own
(`BENCH_DATABASE_URL`, default `ar_bench_long`), migrates it and adds its runs there.

Each run is built through the real engine in-process: the shared workload's agent
(bench/agent.py), one read call per step, step n + 1 answers; so a 10,000-step run
is n = 9,999 (AGENTRUN_MAX_STEPS allows 10,000). A few steps get a retry with a
backoff and a wait event written like the engine writes them, so the strip, the
chart and the search have something to find.

Then, median of REPEAT requests each, server side through Django's test client:
the run page, a step's deep link, the htmx search (several filters; the query also
once cold, before this process has read the run's result text: with the run's stored
search index, built first as a worker would at the run's end, and without it), each as
a process that has not read the run's steps yet and again with them cached
(`timeline.marks`), and `GET /api/runs/{id}` (first page, a late page), after a VACUUM
(ANALYZE) of the project's tables as autovacuum would do (`--no-vacuum`: right after the
inserts); and in headless Chromium, against a `runserver` of this checkout (and of
`--compare`'s, the same database): the time from navigation to idle (load, and every
request the page makes by itself answered) and the HTML bytes. Figures are reported, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ar_bench_long")

from bench import env  # noqa: E402

REPEAT = 5
PASSWORD = "bench-long"
SEARCHES = {
    "text in one result": {"q": "{late_result}"},
    "text in thoughts (common)": {"q": "step 99"},
    "tool": {"tool": "workload_step"},
    "attempts > 1": {"retried": "1"},
    "waited": {"waits": "1"},
    "status + phase": {"status": "succeeded", "phase": "done"},
}


def build(variant: str, n: int) -> Any:
    from django.conf import settings

    from agentrun.lifecycle import services
    from bench.measure import engine_steps

    settings.AGENTRUN_ENQUEUE = False
    run = services.start_run("workload", {"variant": variant, "n": n})
    started = time.perf_counter()
    engine_steps(run.pk, 1, n + 1, time.monotonic() + 3600)
    built = time.perf_counter() - started
    run.refresh_from_db()
    assert run.status == "succeeded", (run.status, run.error)
    _add_backoffs(run, (n // 3, 2 * n // 3))
    return run, built


def vacuum() -> None:
    """What autovacuum does to a table soon after a long run's inserts: the visibility
    map and the planner's statistics. Without it the pages' index-only scans (step
    kinds, the search's tool list) read the just-written heap pages instead."""
    from django.db import connection

    from bench.env import PROJECT_TABLES

    with connection.cursor() as cursor:
        for table in PROJECT_TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")


def _add_backoffs(run: Any, numbers: tuple[int, ...]) -> None:
    """What a transient tool error leaves: a second attempt, a retry_scheduled event, and
    the step's wall time stretched by the backoff."""
    from datetime import timedelta

    from agentrun.audit.events import record_event
    from agentrun.models import Step

    for k in numbers:
        step = Step.objects.get(run=run, number=k)
        Step.objects.filter(pk=step.pk).update(
            attempts=2, finished_at=step.finished_at + timedelta(seconds=4.0)
        )
        record_event(
            "retry_scheduled",
            run=run,
            step=k,
            payload={"backoff_s": 4.0, "error": "TransientToolError: bench", "attempt": 1},
        )


def median_ms(fn: Any, repeat: int = REPEAT, clock: Any = time.perf_counter) -> tuple[float, Any]:
    """The median of `repeat` calls, in ms of `clock` (wall time; process_time: this
    process's CPU, which the other processes on the machine disturb less)."""
    times, out = [], None
    for _ in range(repeat):
        t = clock()
        out = fn()
        times.append((clock() - t) * 1000)
    return statistics.median(times), out


def server_side(run: Any, n_steps: int) -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection
    from django.test import Client

    from debugger.search import forget_call_texts, matching_steps
    from debugger.timeline import forget_marks

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client()
    client.login(username="bench-long", password=PASSWORD)
    hx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-live"}
    out: dict[str, Any] = {}

    def cold(url: str, *args: Any, **kwargs: Any) -> Any:
        """A request of a process that has not read the run's steps yet (timeline.marks)."""
        forget_marks()
        return client.get(url, *args, **kwargs)

    out["search index"] = build_index(run, n_steps)
    client.get(f"/runs/{run.pk}/")  # templates compiled, connection warm
    cpu, page = median_ms(lambda: cold(f"/runs/{run.pk}/"), clock=time.process_time)
    ms, page = median_ms(lambda: cold(f"/runs/{run.pk}/"))
    client.get(f"/runs/{run.pk}/")
    cached, _ = median_ms(lambda: client.get(f"/runs/{run.pk}/"))
    out["run page"] = {
        "ms": ms,
        "cpu ms": cpu,
        "ms (steps cached)": cached,
        "bytes": len(page.content),
        "status": page.status_code,
    }
    mid = n_steps // 2
    cpu, page = median_ms(lambda: cold(f"/runs/{run.pk}/steps/{mid}/"), clock=time.process_time)
    ms, page = median_ms(lambda: cold(f"/runs/{run.pk}/steps/{mid}/"))
    client.get(f"/runs/{run.pk}/steps/{mid}/")
    cached, _ = median_ms(lambda: client.get(f"/runs/{run.pk}/steps/{mid}/"))
    out[f"deep link (step {mid})"] = {
        "ms": ms,
        "cpu ms": cpu,
        "ms (steps cached)": cached,
        "bytes": len(page.content),
    }
    ms, page = median_ms(lambda: cold(f"/runs/{run.pk}/?after={mid}", HTTP_HX_REQUEST="true"))
    out["list page (100 rows)"] = {"ms": ms, "bytes": len(page.content)}
    late_text = f"call_{n_steps - 7}"  # in one step's result only (its thought is "step k")
    out["search"] = {}
    for name, query in SEARCHES.items():
        query = {k: v.replace("{late_result}", late_text) for k, v in query.items()}
        args = {k: (v == "1" if k in ("retried", "waits") else v) for k, v in query.items()}
        # Cold: this process has not read the run's result text yet, a new connection.
        # Without the stored index (a run that ended before it existed), then with it.
        least, settings.AGENTRUN_SEARCH_INDEX_STEPS = settings.AGENTRUN_SEARCH_INDEX_STEPS, 0
        forget_call_texts()
        connection.close()
        scan_ms, _ = median_ms(lambda args=args: matching_steps(run, **args), repeat=1)
        settings.AGENTRUN_SEARCH_INDEX_STEPS = least
        forget_call_texts()
        connection.close()
        cold_ms, _ = median_ms(lambda args=args: matching_steps(run, **args), repeat=1)
        ms_q, found = median_ms(lambda args=args: matching_steps(run, **args))
        ms_p, page = median_ms(lambda query=query: cold(f"/runs/{run.pk}/", query, **hx))
        client.get(f"/runs/{run.pk}/", query, **hx)
        ms_c, _ = median_ms(lambda query=query: client.get(f"/runs/{run.pk}/", query, **hx))
        out["search"][name] = {
            "query ms (first)": cold_ms,
            "query ms (first, no index)": scan_ms,
            "query ms": ms_q,
            "htmx response ms": ms_p,
            "htmx response ms (steps cached)": ms_c,
            "matches": len(found),
            "bytes": len(page.content),
        }
    for label, url in (
        ("first page (200 steps)", f"/api/runs/{run.pk}"),
        ("late page (200 steps)", f"/api/runs/{run.pk}?steps_offset={n_steps - 200}"),
        ("1,000 steps", f"/api/runs/{run.pk}?steps_limit=1000"),
    ):
        ms, resp = median_ms(lambda url=url: client.get(url))
        out[f"API {label}"] = {"ms": ms, "bytes": len(resp.content), "status": resp.status_code}
    return out


def build_index(run: Any, n_steps: int) -> dict[str, Any]:
    """The run's stored search index, built as a worker builds it when a run ends: the
    time, and its bytes (the values as stored, compressed) per step."""
    from django.db import connection

    from agentrun.models import SearchBlock
    from agentrun.store import callsearch

    started = time.perf_counter()
    blocks = callsearch.build(run.pk)
    ms = (time.perf_counter() - started) * 1000
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {SearchBlock._meta.db_table}")
        cursor.execute(
            "SELECT sum(pg_column_size(body) + pg_column_size(steps)), "
            f"sum(length(body)) FROM {SearchBlock._meta.db_table} WHERE run_id = %s",
            [run.pk],
        )
        stored, chars = cursor.fetchone()
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attname = 'body'",
            [SearchBlock._meta.db_table],
        )
        (method,) = cursor.fetchone()
    return {
        "build ms": round(ms),
        "blocks": blocks,
        "text MB": round(chars / 1e6, 1),
        "stored B/step": round(stored / n_steps),
        "compression": {"l": "lz4", "p": "pglz"}.get(method, "default"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(checkout: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(checkout / "manage.py"),
            "runserver",
            f"127.0.0.1:{port}",
            "--noreload",
            "--insecure",
        ],
        cwd=checkout,
        env={**os.environ, "DEBUG": "0", "PYTHONPATH": str(checkout)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"runserver of {checkout} did not start")


IDLE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const ends = performance.getEntriesByType('resource').map(r => r.responseEnd);
  return {load: nav.loadEventEnd, idle: Math.max(nav.loadEventEnd, ...ends),
          html: nav.transferSize, decoded: nav.decodedBodySize,
          elements: document.getElementsByTagName('*').length};
}"""


def browser_side(url: str, run: Any, n_steps: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(f"{url}/login/")
        page.fill("input[name=username]", "bench-long")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_load_state("networkidle")
        for label, path in (
            ("run page", f"/runs/{run.pk}/"),
            (f"deep link (step {n_steps // 2})", f"/runs/{run.pk}/steps/{n_steps // 2}/"),
        ):
            figures = []
            for _ in range(3):
                page.goto(f"{url}{path}", wait_until="load")
                page.wait_for_load_state("networkidle")
                figures.append(page.evaluate(IDLE))
            best = min(figures, key=lambda f: f["idle"])
            out[label] = {
                "load ms": round(best["load"]),
                "idle ms": round(best["idle"]),
                "html bytes": best["decoded"],
                "elements": best["elements"],
            }
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="flat")
    parser.add_argument("--steps", type=int, default=10_000, help="steps of the flat run")
    parser.add_argument("--grow-steps", type=int, default=2_000, help="steps of the grow run")
    parser.add_argument("--compare", type=Path, help="another checkout (e.g. /work/main)")
    parser.add_argument(
        "--reuse",
        default="",
        help="variant=RUN_ID,...: measure runs this script built before (same database)",
    )
    parser.add_argument(
        "--no-vacuum",
        action="store_true",
        help="measure right after the inserts, before autovacuum would have run",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "long_run.json")
    args = parser.parse_args()
    reuse = dict(pair.split("=", 1) for pair in args.reuse.split(",") if pair)

    env.setup()
    from agentrun.security.roles import create_user

    create_user("bench-long", "viewer", PASSWORD)
    results: dict[str, Any] = {"server": env.server_settings()}
    for variant in args.variants.split(","):
        steps = args.steps if variant == "flat" else args.grow_steps
        if variant in reuse:
            from agentrun.models import Run

            run, built = Run.objects.get(pk=reuse[variant]), 0.0
        else:
            run, built = build(variant, steps - 1)
        label = f"{variant}, {steps:,} steps"
        print(f"== {label}: built through the engine in {built:.0f} s ({run.pk})", flush=True)
        row: dict[str, Any] = {"run": str(run.pk), "build s": round(built, 1)}
        if args.no_vacuum:
            row["server (just written, not vacuumed)"] = server_side(run, steps)
        else:
            vacuum()
            row["server"] = server_side(run, steps)
        from django.db import connection

        connection.close()
        for name, checkout in (("this", ROOT), ("compare", args.compare)):
            if checkout is None:
                continue
            proc, url = serve(checkout)
            try:
                row[f"browser ({name}: {checkout})"] = browser_side(url, run, steps)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        results[label] = row
        print(json.dumps(row, indent=2, default=str), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
