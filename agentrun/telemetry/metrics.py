"""Prometheus metrics, from two places.

- The database, at scrape time (`DatabaseCollector`, served on the web's `/metrics`): runs
  by agent and status, steps committed, tokens and cost, runs waiting for a worker, live
  workers by code version. Every process that writes a run writes these tables, so one
  query answers for all of them, and a restart or a scrape of another gunicorn worker
  gives the same numbers.
- Each worker process, as it runs steps (the counters and histograms below, served on the
  worker's own port, `AGENTRUN_WORKER_METRICS_PORT`): step attempts by outcome, their
  durations, model request latencies, tool calls by outcome. These are events the tables
  keep only until retention purges a run's steps; Prometheus adds the workers up.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Sum
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agentrun.models import ACTIVE_STATUSES, Run, RunStatus, Worker

log = logging.getLogger(__name__)

# --- measured by each worker process --------------------------------------------------------

# Steps last from milliseconds (a scripted step) to minutes (a model, a slow tool).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)

STEP_ATTEMPTS = Counter(
    "agentrun_step_attempts",
    "Step attempts this worker ended, by agent and outcome (committed, finished, failed, "
    "backoff, waiting, lost, crashed)",
    ["agent", "outcome"],
)
STEP_DURATION = Histogram(
    "agentrun_step_duration_seconds",
    "How long a step attempt took, claim to outcome, by agent and outcome",
    ["agent", "outcome"],
    buckets=STEP_BUCKETS,
)
LLM_DURATION = Histogram(
    "agentrun_llm_request_duration_seconds",
    "How long a model took to answer a step's request, by agent and model",
    ["agent", "model"],
    buckets=LLM_BUCKETS,
)
TOOL_CALLS = Counter(
    "agentrun_tool_calls",
    "Tool calls of the steps this worker ended, by agent, tool and status",
    ["agent", "tool", "status"],
)
RECONCILER = Counter(
    "agentrun_reconciler_actions",
    "What the reconciler's passes in this worker did: runs re-enqueued (a lost wake-up, a "
    "dead worker's expired lease, a due backoff), hybrid calls compensated, failures "
    "notified to the webhook, webhook retries sent again, and committed steps whose spans "
    "were emitted again (their export was not on record)",
    ["action"],
)


def count_reconciled(done: dict[str, Any]) -> None:
    """Count one reconciler pass's actions (its summary, as the task returns it)."""
    webhooks = done.get("webhooks") or {}
    for action, n in (
        ("enqueued", done.get("enqueued", 0)),
        ("compensated", done.get("compensated", 0)),
        ("webhook_notified", webhooks.get("notified", 0)),
        ("webhook_resent", webhooks.get("resent", 0)),
        ("steps_traced_again", done.get("traced_again", 0)),
    ):
        RECONCILER.labels(action).inc(n)


class PoolCollector(Collector):
    """This process's database connection pool (psycopg_pool, PostgreSQL with
    DB_POOL_MAX_SIZE > 0), read at scrape time: its connections in use and idle, the
    requests waiting for one now, and since the process started how many requests had to
    wait, how long they waited in all, and how many gave up (DB_POOL_TIMEOUT)."""

    def describe(self) -> Any:
        return []  # registered at import: reading the pool then would create it

    def collect(self) -> Any:
        from django.db import DEFAULT_DB_ALIAS, connections

        conn = connections[DEFAULT_DB_ALIAS]
        if conn.vendor != "postgresql" or not (conn.settings_dict.get("OPTIONS") or {}).get("pool"):
            return []
        stats = conn.pool.get_stats()
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        conns = GaugeMetricFamily(
            "agentrun_db_pool_connections",
            "This process's pooled database connections, by state (in_use, idle), and the "
            "pool's maximum (max)",
            labels=["state"],
        )
        conns.add_metric(["in_use"], size - idle)
        conns.add_metric(["idle"], idle)
        conns.add_metric(["max"], stats.get("pool_max", 0))
        waiting = GaugeMetricFamily(
            "agentrun_db_pool_requests_waiting",
            "Requests for a database connection waiting for one now, in this process",
        )
        waiting.add_metric([], stats.get("requests_waiting", 0))
        requests = CounterMetricFamily(
            "agentrun_db_pool_requests", "Requests for a pooled connection, this process"
        )
        requests.add_metric([], stats.get("requests_num", 0))
        waits = CounterMetricFamily(
            "agentrun_db_pool_waits",
            "Requests for a pooled connection that had to wait for one (none was idle)",
        )
        waits.add_metric([], stats.get("requests_queued", 0))
        waited = CounterMetricFamily(
            "agentrun_db_pool_wait_seconds", "Time requests waited for a pooled connection"
        )
        waited.add_metric([], stats.get("requests_wait_ms", 0) / 1000)
        errors = CounterMetricFamily(
            "agentrun_db_pool_timeouts",
            "Requests for a pooled connection that waited DB_POOL_TIMEOUT and failed",
        )
        errors.add_metric([], stats.get("requests_errors", 0))
        return [conns, waiting, requests, waits, waited, errors]


# On the worker's port (the default registry, which start_http_server serves).
REGISTRY.register(PoolCollector())


def serve_worker_metrics() -> int | None:
    """Serve this process's metrics on AGENTRUN_WORKER_METRICS_PORT (0: not at all).

    Bound to AGENTRUN_WORKER_METRICS_ADDR (127.0.0.1 by default): the port has no login,
    so what may reach it is what may read it. Returns the port, or None.
    """
    port = settings.AGENTRUN_WORKER_METRICS_PORT
    if not port:
        return None
    try:
        start_http_server(port, addr=settings.AGENTRUN_WORKER_METRICS_ADDR)
    except OSError as exc:  # another worker on this host has the port: no metrics, still work
        log.warning("worker metrics: can't listen on port %s: %s", port, exc)
        return None
    log.info("worker metrics on %s:%s", settings.AGENTRUN_WORKER_METRICS_ADDR, port)
    return port


# --- read from the database at scrape time ----------------------------------------------------


class CachedCollector(Collector):
    """A collector whose families are read at most once per AGENTRUN_METRICS_CACHE_SECONDS,
    so that several scrapers (or a scrape of every gunicorn worker) cost one read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = 0.0
        self._families: list[Any] = []

    def collect(self) -> Any:
        with self._lock:
            ttl = settings.AGENTRUN_METRICS_CACHE_SECONDS
            if not self._families or time.monotonic() - self._at >= ttl:
                self._families = self._read()
                self._at = time.monotonic()
            return list(self._families)

    def _read(self) -> list[Any]:
        raise NotImplementedError


class CountsCollector(CachedCollector):
    """A gauge of counts by one label, from a function that reads them (`read()` →
    {label value: count}): how layers above this one add what they know, unimported here."""

    def __init__(self, name: str, documentation: str, label: str, read: Any) -> None:
        super().__init__()
        self.name, self.documentation, self.label, self.read = name, documentation, label, read

    def _read(self) -> list[Any]:
        gauge = GaugeMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, n in sorted(self.read().items()):
            gauge.add_metric([value], n)
        return [gauge]


class DatabaseCollector(CachedCollector):
    """The runs, steps, tokens, cost and workers the database holds, at scrape time.

    Two aggregate queries over the run table (one row a run, never deleted by retention,
    so the totals only grow) and one over the few live workers.
    """

    def _read(self) -> list[Any]:
        started = time.perf_counter()
        started_total = CounterMetricFamily(
            "agentrun_runs_started", "Runs created, by agent", labels=["agent"]
        )
        ended = CounterMetricFamily(
            "agentrun_runs_ended",
            "Runs that ended, by agent and status (succeeded, failed, cancelled)",
            labels=["agent", "status"],
        )
        active = GaugeMetricFamily(
            "agentrun_runs_active",
            "Runs not ended yet, by agent, status and what a waiting run waits for",
            labels=["agent", "status", "wait_reason"],
        )
        steps = CounterMetricFamily(
            "agentrun_steps_committed", "Steps committed, by agent", labels=["agent"]
        )
        tokens = CounterMetricFamily(
            "agentrun_llm_tokens",
            "Model tokens of committed decisions, by agent and type (input, output, and "
            "cached: the part of input the provider served from its cache)",
            labels=["agent", "type"],
        )
        cost = CounterMetricFamily(
            "agentrun_llm_cost_usd",
            "What the runs' model calls cost at AGENTRUN_LLM_PRICES, US dollars, by agent",
            labels=["agent"],
        )
        by_agent: dict[str, list[float]] = {}
        rows = (
            Run.objects.filter(imported_at__isnull=True)
            .order_by()
            .values("agent", "status", "wait_reason")
            .annotate(
                n=Count("id"),
                steps=Sum(F("next_step") - F("first_step")),
                tin=Sum("tokens_in"),
                tout=Sum("tokens_out"),
                tcached=Sum("tokens_cached"),
                cost=Sum("cost_usd"),
            )
        )
        ended_counts: dict[tuple[str, str], int] = {}
        for row in rows:
            agent, status = row["agent"], row["status"]
            totals = by_agent.setdefault(agent, [0, 0, 0, 0, 0, 0.0])
            for i, key in enumerate(("n", "steps", "tin", "tout", "tcached", "cost")):
                totals[i] += row[key] or 0
            if status in ACTIVE_STATUSES:
                active.add_metric([agent, status, row["wait_reason"] or ""], row["n"])
            else:
                ended_counts[(agent, status)] = ended_counts.get((agent, status), 0) + row["n"]
        for agent, (n, nsteps, tin, tout, tcached, usd) in sorted(by_agent.items()):
            started_total.add_metric([agent], n)
            steps.add_metric([agent], nsteps)
            tokens.add_metric([agent, "input"], tin)
            tokens.add_metric([agent, "output"], tout)
            tokens.add_metric([agent, "cached"], tcached)
            cost.add_metric([agent], usd)
            for status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
                ended.add_metric([agent, str(status)], ended_counts.get((agent, status), 0))
        now = timezone.now()
        runnable = GaugeMetricFamily(
            "agentrun_runs_runnable",
            "Runs due to run now that no worker holds: the queue a worker should be taking",
        )
        runnable.add_metric([], Run.objects.filter(imported_at__isnull=True).runnable(now).count())
        workers = GaugeMetricFamily(
            "agentrun_workers", "Live worker processes, by code version", labels=["version"]
        )
        # Alive: heard from within three heartbeats (as agentrun.engine.versions counts them).
        heartbeat = max(settings.AGENTRUN_WORKER_HEARTBEAT_SECONDS, 0.5)
        alive = (
            Worker.objects.filter(seen_at__gte=now - timedelta(seconds=3 * heartbeat))
            .order_by()
            .values("version")
            .annotate(n=Count("name"))
        )
        for row in alive:
            workers.add_metric([row["version"]], row["n"])
        took = GaugeMetricFamily(
            "agentrun_metrics_query_seconds",
            "How long reading these metrics from the database took",
        )
        took.add_metric([], time.perf_counter() - started)
        return [started_total, ended, active, steps, tokens, cost, runnable, workers, took]


#: The web's /metrics: the database's view (the web process runs no steps of its own).
WEB_REGISTRY = CollectorRegistry(auto_describe=False)
WEB_REGISTRY.register(DatabaseCollector())
_COUNTS: set[str] = set()


def add_counts(name: str, documentation: str, label: str, read: Any) -> None:
    """Serve a gauge of counts on the web's /metrics (once per name, however often asked)."""
    if name not in _COUNTS:
        _COUNTS.add(name)
        WEB_REGISTRY.register(CountsCollector(name, documentation, label, read))
