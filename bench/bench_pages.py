"""How fast the debugger's pages render for a big run. Run by hand, not by pytest:

    AGENTRUN_VAR_DIR=/tmp/ar-bench .venv/bin/python bench/bench_pages.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_dash_bench .venv/bin/python bench/bench_pages.py

Give it a database of its own: it migrates it and adds runs of agent "bench".
It inserts a 1,000-step run straight through the snapshot store (the shared
workload's "grow" variant: the state reaches 2.5 MB), then times, server-side
through Django's test client, the run detail page, one step's body, the timeline,
a snapshot page, the pre → post diff of the last step and the diff of two ~2.5 MB
snapshots that differ a little, plus the run list over 10,000 runs (added once,
as plain rows). Prints medians and each page's number of queries.

Nothing is cached between requests, so every repeat of a page pays for what its
first view does (loading states included).
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), "/work/shared/bench", str(ROOT.parent / "shared" / "bench")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/agentrun-bench")
os.environ.setdefault("AGENTRUN_ENQUEUE", "false")

import django  # noqa: E402

django.setup()

import workload  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from agentrun.models import Run, Snapshot, Step, ToolCall  # noqa: E402
from agentrun.security.roles import create_user  # noqa: E402
from agentrun.store import snapshots  # noqa: E402
from debugger import timeline  # noqa: E402
from debugger.diffs import diff_states  # noqa: E402

STEPS = 1000
LIST_RUNS = 10_000
REPEAT = 7
PHASES = {"plan": "planning", "act": "executing", "reflect": "reflecting"}


def insert_run(steps: int) -> Run:
    """A finished run of `steps` steps: rows written directly, snapshots through the store."""
    now = timezone.now()
    run = Run.objects.create(
        agent="bench",
        agent_version="workload",
        input={"goal": f"{steps}-step workload"},
        status="succeeded",
        phase="reflecting",
        next_step=steps + 1,
        started_at=now,
        finished_at=now,
    )
    state = workload.initial_state("grow")
    prev: Snapshot | None = None
    node: Any = None
    batch_steps, batch_calls, batch_snaps = [], [], []
    for k in range(1, steps + 1):
        if prev is None:
            pre, node = snapshots.build(run.pk, k, "pre", state, None, None)
        else:
            pre = snapshots.reference(run.pk, k, "pre", prev)
        d = workload.step_delta(k, "grow")
        new_state = workload.apply_delta(state, d, "grow")
        post, node = snapshots.build(
            run.pk, k, "post", new_state, pre, state, prev_node=node, outcome="succeeded"
        )
        batch_snaps += [pre, post]
        step = Step(
            run=run,
            number=k,
            status="succeeded",
            attempts=1 + (k % 97 == 0),
            phase_before=PHASES[state["phase"]] if k > 1 else "idle",
            phase_after=PHASES[d["phase"]],
            decision={
                "thought": d["messages"][0]["content"][:120],
                "rationale": "",
                "calls": [],
                "final": None,
            },
            duration_ms=5 + (k % 13) * 1.7,
            state_size=post.size,
            started_at=now,
            finished_at=now,
        )
        batch_steps.append(step)
        prev, state = post, new_state
    with transaction.atomic():
        Step.objects.bulk_create(batch_steps, batch_size=200)
        Snapshot.objects.bulk_create(batch_snaps, batch_size=100)
        for step in Step.objects.filter(run=run).only("pk", "number"):
            call = workload.step_delta(step.number, "grow")["tool_calls"][0]
            batch_calls.append(
                ToolCall(
                    run=run,
                    step=step,
                    index=0,
                    tool=call["tool"],
                    kind="read",
                    args=call["args"],
                    args_hash=f"{step.number:016x}",
                    idempotency_key=f"{run.pk}:{step.number}:0:{call['tool']}",
                    status="ok",
                    result=call["result"],
                    attempts=[
                        {"at": now.isoformat(), "started": True, "ended": True, "duration_ms": 1.0}
                    ],
                )
            )
        ToolCall.objects.bulk_create(batch_calls, batch_size=200)
    assert workload.fingerprint(snapshots.load(run.pk, steps, "post")) == workload.fingerprint(
        state
    )
    return run


def insert_single(state: dict[str, Any]) -> Run:
    now = timezone.now()
    run = Run.objects.create(
        agent="bench",
        input={"goal": "one snapshot"},
        status="succeeded",
        next_step=2,
        started_at=now,
        finished_at=now,
    )
    Step.objects.create(run=run, number=1, status="succeeded", started_at=now, finished_at=now)
    snap, node = snapshots.build(run.pk, 1, "pre", state, None, None)
    snap.save()
    snapshots.reference(run.pk, 1, "post", snap).save()
    return run


def insert_list_runs(count: int) -> None:
    """Enough finished and active runs of several agents for the run list to page through."""
    have = Run.objects.filter(agent__startswith="list-").count()
    if have >= count:
        return
    now = timezone.now()
    statuses = ["succeeded"] * 6 + ["failed", "cancelled", "running", "waiting"]
    Run.objects.bulk_create(
        [
            Run(
                agent=f"list-{i % 5}",
                agent_version="v1",
                input={"goal": f"list run {i}: " + "a longer goal for the row " * (i % 3)},
                status=statuses[i % len(statuses)],
                phase="reflecting",
                next_step=2 + i % 40,
                started_at=now,
                finished_at=now,
            )
            for i in range(have, count)
        ],
        batch_size=1000,
    )


def insert_list_labels() -> None:
    """Three labels per list run (one of 10 stories, 1 of 100 customers, the agent),
    and a retry event on every 7th run, for the label filter and the "retried" mark."""
    from agentrun.models import Event, RunLabel

    if RunLabel.objects.filter(key="story", run__agent__startswith="list-").exists():
        return
    ids = list(Run.objects.filter(agent__startswith="list-").values_list("pk", flat=True))
    RunLabel.objects.bulk_create(
        [
            RunLabel(run_id=pk, key=key, value=value)
            for i, pk in enumerate(ids)
            for key, value in (
                ("story", f"story-{i % 10}"),
                ("customer", f"c{i % 100}"),
                ("team", "bench"),
            )
        ],
        batch_size=2000,
    )
    Event.objects.bulk_create(
        [Event(run_id=pk, kind="retry_scheduled", actor="system", step=1) for pk in ids[::7]],
        batch_size=2000,
    )


def timed(label: str, fn: Any, repeat: int = REPEAT) -> float:
    with CaptureQueriesContext(connection) as queries:
        fn()  # warm caches (templates, imports)
    label = f"{label} [{len(queries)} q]"
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    median = statistics.median(samples)
    print(f"{label:<66} median {median:8.1f} ms   (min {min(samples):.1f}, max {max(samples):.1f})")
    return median


def get(client: Client, url: str, **headers: str) -> Any:
    def fetch() -> None:
        response = client.get(url, **headers)
        assert response.status_code in (200, 286), (url, response.status_code)
        fetch.size = len(response.content)  # type: ignore[attr-defined]

    return fetch


def main() -> None:
    call_command("migrate", verbosity=0)
    db = django.db.connection.vendor
    print(f"database: {db}; building a {STEPS}-step run through the snapshot store…")
    started = time.perf_counter()
    run = insert_run(STEPS)
    print(f"  inserted in {time.perf_counter() - started:.1f} s")

    big = snapshots.load(run.pk, STEPS, "post")
    notes = dict(big["memory"]["notes"])
    notes["note_05"] += " (edited by an operator)"
    # Shares every untouched item with `big`, as consecutive snapshots of a run do.
    edited = {
        **big,
        "memory": {**big["memory"], "notes": notes},
        "messages": [*big["messages"], {"role": "user", "content": "one more question"}],
    }
    other = insert_single(edited)
    insert_list_runs(LIST_RUNS)

    client = Client(HTTP_HOST="localhost")
    client.force_login(create_user("bench-viewer", "viewer", "bench"))
    r = run.pk
    hx = {"HTTP_HX_REQUEST": "true"}
    print()
    detail = get(client, f"/runs/{r}/")
    timed(f"run detail page, {STEPS} steps (strip + list + last step)", detail)
    print(f"  {detail.size / 1024:.0f} KB of HTML")  # type: ignore[attr-defined]
    timed(
        "one step's body (htmx partial)",
        get(client, f"/runs/{r}/steps/500/", HTTP_HX_TARGET="step-body", **hx),
    )
    timed(
        "live refresh after a change (header + strip + list)",
        get(client, f"/runs/{r}/live/?v=x", **hx),
    )
    timed(f"timeline rows of {STEPS} steps (debugger.timeline.rows)", lambda: timeline.rows(run))
    runs = Run.objects.count()
    timed(f"run list, first page of {runs:,} runs", get(client, "/"))
    timed(f"run list, page 100 of {runs:,} runs", get(client, "/?page=100"))
    timed("run list, failed runs only", get(client, "/?status=failed"))
    timed("run list refresh (htmx rows)", get(client, "/?v=x", HTTP_HX_TARGET="run-rows", **hx))
    insert_list_labels()
    timed("run list, one customer's runs (?label=customer=c7)", get(client, "/?label=customer=c7"))
    timed(
        "run list, a tenth of the runs (?label=story=story-3)", get(client, "/?label=story=story-3")
    )
    timed(
        "run list, two labels (story-3 and customer c3)",
        get(client, "/?label=story=story-3&label=customer=c3"),
    )
    timed(
        f"snapshot page, post of step {STEPS} (2.5 MB state)",
        get(client, f"/runs/{r}/steps/{STEPS}/post/"),
    )
    timed(f"pre → post diff of step {STEPS} (page)", get(client, f"/runs/{r}/steps/{STEPS}/diff/"))
    timed(
        f"diff of post {STEPS // 4} vs post {3 * STEPS // 4} (page)",
        get(client, f"/diff/?a={r}:{STEPS // 4}:post&b={r}:{3 * STEPS // 4}:post"),
    )
    timed(
        "diff of two ~2.5 MB snapshots of two runs (page)",
        get(client, f"/diff/?a={r}:{STEPS}:post&b={other.pk}:1:pre"),
    )
    timed(
        "diff of two ~2.5 MB states, diff_states() alone (shared items)",
        lambda: diff_states(big, edited, 1, 1),
    )
    unshared = copy.deepcopy(edited)
    timed(
        "diff of two ~2.5 MB states, diff_states() alone (no sharing)",
        lambda: diff_states(big, unshared, 1, 1),
    )
    print("  →", diff_states(big, unshared, 1, 1).summary)


if __name__ == "__main__":
    main()
