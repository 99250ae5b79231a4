"""Prometheus metrics after real runs on a real worker: the web's /metrics (read from the
database) and the worker's own port (what it measured) parse with the Prometheus client's
parser, and every number agrees with what the database holds."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from agentrun.lifecycle import services
from agentrun.models import Event, Run, Step, ToolCall, Worker
from tests.agentrun.llm_load import llm_env
from tests.base import calls, final, script
from tests.fake_openai import FakeOpenAI, completion, tool_call
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TOKEN = "metrics-test-token"
PRICES = {"fake-model": {"input": 1.0, "output": 2.0}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted labels) → value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def model(request):
    """One echo call, then the answer."""
    if request.json["messages"][-1]["role"] == "tool":
        return completion("all done", prompt_tokens=120, completion_tokens=30)
    return completion(tool_calls=[tool_call("echo", {"x": 1})], prompt_tokens=100, completion_tokens=20)  # fmt: skip


def scrape_web(client: Client) -> dict:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def test_metrics_after_real_runs_agree_with_the_database(start_worker, settings):
    settings.AGENTRUN_METRICS_TOKEN = TOKEN
    settings.AGENTRUN_METRICS_CACHE_SECONDS = 0
    port = free_port()
    with FakeOpenAI(respond=model) as fake:
        start_worker(
            AGENTRUN_WORKER_METRICS_PORT=str(port),
            AGENTRUN_LLM_PRICES=json.dumps(PRICES),
            **llm_env(fake),
        )
        runs = [
            *(
                services.start_run(
                    "scripted", script(calls({"tool": "echo", "args": {"i": i}}), final())
                )
                for i in range(3)
            ),  # fmt: skip
            services.start_run("scripted", script(calls({"tool": "fail", "args": {}}), final())),
            services.start_run(
                "scripted", script(calls({"tool": "flaky", "args": {"failures": 1}}), final())
            ),
            *(services.start_run("llm", {"goal": f"job {i}", "tools": ["echo"]}) for i in range(2)),
        ]
        ids = [r.pk for r in runs]
        wait_until(
            lambda: (
                not Run.objects.filter(
                    pk__in=ids, status__in=("queued", "running", "waiting")
                ).exists()
            ),  # fmt: skip
            timeout=90,
            what="every run to end",
        )

    web = scrape_web(Client())
    # Runs by agent and status, steps, tokens and cost: as the run table says.
    for agent in ("scripted", "llm"):
        mine = Run.objects.filter(agent=agent)
        assert web[("agentrun_runs_started_total", (("agent", agent),))] == mine.count()
        for status in ("succeeded", "failed", "cancelled"):
            assert web[("agentrun_runs_ended_total", (("agent", agent), ("status", status)))] == (
                mine.filter(status=status).count()
            ), (agent, status)
        committed = Step.objects.filter(run__agent=agent, finished_at__isnull=False).count()
        assert web[("agentrun_steps_committed_total", (("agent", agent),))] == committed
    assert web[("agentrun_runs_ended_total", (("agent", "scripted"), ("status", "failed")))] == 1
    llm = Run.objects.filter(agent="llm").aggregate(
        i=Sum("tokens_in"), o=Sum("tokens_out"), c=Sum("cost_usd")
    )
    assert llm["i"] == 2 * (100 + 120) and llm["o"] == 2 * (20 + 30)
    assert web[("agentrun_llm_tokens_total", (("agent", "llm"), ("type", "input")))] == llm["i"]
    assert web[("agentrun_llm_tokens_total", (("agent", "llm"), ("type", "output")))] == llm["o"]
    assert web[("agentrun_llm_cost_usd_total", (("agent", "llm"),))] == pytest.approx(llm["c"])
    assert llm["c"] == pytest.approx((440 * 1.0 + 100 * 2.0) / 1e6)
    assert web[("agentrun_runs_runnable", ())] == 0
    version = Worker.objects.get().version
    assert web[("agentrun_workers", (("version", version),))] == 1
    assert not any(name == "agentrun_runs_active" for name, _ in web)  # nothing in flight

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:  # noqa: S310
        worker = samples(response.read().decode())
    # Step attempts by outcome: the steps on record, and the retries the event log holds.
    for agent in ("scripted", "llm"):
        steps = Step.objects.filter(run__agent=agent)
        done = worker.get(("agentrun_step_attempts_total", (("agent", agent), ("outcome", "committed"))), 0)  # fmt: skip
        done += worker[
            ("agentrun_step_attempts_total", (("agent", agent), ("outcome", "finished")))
        ]
        assert done == steps.filter(status="succeeded").count(), agent
        failed = worker.get(("agentrun_step_attempts_total", (("agent", agent), ("outcome", "failed"))), 0)  # fmt: skip
        assert failed == steps.filter(status="failed").count(), agent
        backoffs = Event.objects.filter(run__agent=agent, kind="retry_scheduled").count()
        assert worker.get(("agentrun_step_attempts_total", (("agent", agent), ("outcome", "backoff"))), 0) == backoffs  # fmt: skip
    assert backoffs == 0 and Event.objects.filter(kind="retry_scheduled").count() == 1
    # Tool calls by tool and status, as the calls are on record.
    on_record = Counter(ToolCall.objects.values_list("run__agent", "tool", "status"))
    measured = {
        (dict(labels)["agent"], dict(labels)["tool"], dict(labels)["status"]): value
        for (name, labels), value in worker.items()
        if name == "agentrun_tool_calls_total"
    }
    assert measured == on_record
    assert measured[("scripted", "fail", "failed")] == 1
    # One model request per llm step, its latency as the step recorded it.
    llm_steps = Step.objects.filter(run__agent="llm")
    key = ("agentrun_llm_request_duration_seconds_count", (("agent", "llm"), ("model", "fake-model")))  # fmt: skip
    assert worker[key] == llm_steps.count() == 4
    recorded = sum(s.llm_latency_ms for s in llm_steps) / 1000
    total = worker[("agentrun_llm_request_duration_seconds_sum", key[1])]
    assert recorded <= total < recorded + 0.05 * 4  # the step's own timer, a little wider
    # The worker's connection pool (PostgreSQL): what its steps asked of it, and its size.
    if connection.vendor == "postgresql":
        assert worker[("agentrun_db_pool_requests_total", ())] >= Step.objects.count()
        most = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
        assert worker[("agentrun_db_pool_connections", (("state", "max"),))] == most > 0
        in_use = worker[("agentrun_db_pool_connections", (("state", "in_use"),))]
        assert 0 <= in_use <= most
        assert worker[("agentrun_db_pool_waits_total", ())] >= 0
        assert worker[("agentrun_db_pool_timeouts_total", ())] == 0
    else:
        assert not any(name.startswith("agentrun_db_pool") for name, _ in worker)


def test_metrics_need_the_token_and_are_off_without_one(db, settings):
    settings.AGENTRUN_METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    settings.AGENTRUN_METRICS_TOKEN = TOKEN
    assert Client().get("/metrics").status_code == 401
    refused = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert refused.status_code == 401 and b"agentrun_" not in refused.content
    assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_the_reconcilers_re_enqueues_are_counted(start_worker, settings):
    settings.AGENTRUN_ENQUEUE = False  # the runs' wake-ups are lost: only the reconciler finds them
    lost = [services.start_run("scripted", script(calls({"tool": "echo", "args": {}}), final())) for _ in range(2)]  # fmt: skip
    port = free_port()
    start_worker(beat=True, AGENTRUN_WORKER_METRICS_PORT=str(port))
    wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in lost], status="succeeded").count() == 2,
        timeout=60,
        what="the reconciler to find the runs",
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:  # noqa: S310
        worker = samples(response.read().decode())
    # Each run re-enqueued at least once (a pass may come again before its step is claimed).
    assert worker[("agentrun_reconciler_actions_total", (("action", "enqueued"),))] >= 2
    assert worker[("agentrun_reconciler_actions_total", (("action", "compensated"),))] == 0


def test_runs_in_flight_by_state_as_the_now_page_counts_them(db, settings):
    from agentrun.engine import inflight
    from tests.base import make_in_flight

    settings.AGENTRUN_METRICS_TOKEN = TOKEN
    settings.AGENTRUN_METRICS_CACHE_SECONDS = 0
    make_in_flight("deciding", 2)
    make_in_flight("approval", 1)
    web = scrape_web(Client())
    counts = inflight.counts()
    assert counts["deciding"] == 2 and counts["approval"] == 1
    for state, n in counts.items():
        assert web[("agentrun_runs_in_flight", (("state", state),))] == n
