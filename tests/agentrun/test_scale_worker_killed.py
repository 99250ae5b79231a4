"""A worker killed with a hundred steps in flight loses nothing and repeats nothing.

Each run pays into a ledger twice, each payment decided by a slow model, then
answers. The first payment is slow to acknowledge: it lands in the ledger, then
takes a second to return. The worker is SIGKILLed while about half the runs have
paid once: its steps in flight are waiting on the model, or on a payment that has
landed but not returned. A new worker's reconciler finds the runs whose lease
expired and finishes them: the model is asked again only for decisions that were
not on record, and each ledger key has one entry.
"""

import contextlib
import signal
import socket
import threading
import time
import urllib.request
from collections import Counter

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from agentrun.builtin.tools import ledger_write
from agentrun.models import LedgerEntry, LedgerInvocation, ToolCall
from agentrun.tools import ToolContext, tool
from tests.agentrun.llm_load import (
    all_finished,
    decided_turns,
    decision_counts,
    explain,
    goal_of,
    llm_env,
    on_postgres,
    requests_per_turn,
    spread,
    start_runs,
    statuses,
    turn_of,
)
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, tool_call
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.durability]
TOKEN = "scrape-during-the-kill"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# An embedded worker runs 8 steps at a time (SQLite has one writer): 16 runs keep it
# full, half in flight and half queued, when it is killed.
RUNS = 100 if on_postgres() else 16
CAPACITY = min(RUNS, settings.AGENTRUN_WORKER_CONCURRENCY)  # steps in flight at once


# The worker loads this module (AGENTRUN_AGENT_MODULES).
@tool(kind="write", idempotent=True, parameters=ledger_write.parameters)
def pay_slow_ack(ctx: ToolContext, account: str, amount: float) -> dict:
    """ledger_write, then a second before it returns: a payment API slow to acknowledge."""
    result = ledger_write(ctx, {"account": account, "amount": amount})
    # Back to the pool before the wait: a tool thread's connection stays checked out
    # until it is closed, and a hundred tools each holding one for a second would
    # starve the steps and the lease watchdog (test_scale_tool_holding_a_connection).
    connection.close()
    time.sleep(1.0)
    return result


def paying_model(request: Recorded) -> Reply:
    """Pay 10 slowly (decided after 0.2-2 s), pay 20 (decided after 2 s), then answer."""
    account = goal_of(request).split(":")[0]
    turn = turn_of(request)
    if turn == 0:
        pay = tool_call("pay_slow_ack", {"account": account, "amount": 10}, id="call_pay_10")
        return Reply(200, completion(tool_calls=[pay]), delay=spread(request, 0.2, 2.0))
    if turn == 1:
        pay = tool_call("ledger_write", {"account": account, "amount": 20}, id="call_pay_20")
        return Reply(200, completion(tool_calls=[pay]), delay=2.0)
    return Reply(200, completion("paid 30"), delay=0.2)


class Scraper:
    """Prometheus, as it would scrape during the incident: the web's /metrics and the
    replacement worker's port, every 0.3 s, each exposition parsed by the client's parser."""

    def __init__(self) -> None:
        self.scrapes: list[dict] = []
        self.failures: list[str] = []
        self.worker_port: int | None = None
        self.worker_scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client = Client()
        try:
            while not self._stop.wait(0.3):
                try:
                    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
                    assert response.status_code == 200, response.status_code
                    self.scrapes.append(samples(response.content.decode()))
                    if self.worker_port:
                        url = f"http://127.0.0.1:{self.worker_port}/metrics"
                        with (
                            contextlib.suppress(OSError),  # not listening yet
                            urllib.request.urlopen(url, timeout=5) as r,  # noqa: S310
                        ):
                            worker = samples(r.read().decode())
                            self.worker_scrapes += 1
                            assert (
                                "agentrun_db_pool_connections",
                                (("state", "max"),),
                            ) in worker or connection.vendor != "postgresql"
                except Exception as exc:  # what a scrape that fails or doesn't parse says
                    self.failures.append(repr(exc))
        finally:
            connection.close()

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_killing_a_worker_with_a_hundred_steps_in_flight_loses_and_repeats_nothing(
    start_worker, settings
):
    settings.AGENTRUN_METRICS_TOKEN = TOKEN
    settings.AGENTRUN_METRICS_CACHE_SECONDS = 0
    with FakeOpenAI(respond=paying_model) as fake, Scraper() as scraper:
        env = llm_env(fake, AGENTRUN_AGENT_MODULES=__name__)
        # The worker first: it may take the messages before it says it is ready (RabbitMQ
        # hands them over at once), and the runs must not be done by then.
        doomed = start_worker(**env)
        runs = start_runs(RUNS, tools=["pay_slow_ack", "ledger_write"])

        def mid_payment() -> int:
            """Payments that landed in the ledger but have not returned to their step."""
            returned = ToolCall.objects.filter(run__in=runs, status="ok")
            landed = LedgerEntry.objects.filter(run__in=runs)
            return landed.exclude(idempotency_key__in=returned.values("idempotency_key")).count()

        # Kill it with its steps in flight: many waiting on the model, some on a payment.
        wait_until(
            lambda: (
                LedgerEntry.objects.filter(run__in=runs).count() >= RUNS // 3
                and fake.in_flight >= CAPACITY // 3
                and mid_payment() >= CAPACITY // 8
            ),
            timeout=60,
            interval=0.02,
            what="steps in flight waiting on the model and on payments",
        )
        in_flight, paying = fake.in_flight, mid_payment()
        doomed.signal(signal.SIGKILL)
        doomed.proc.wait(timeout=10)
        killed_at = time.monotonic()
        time.sleep(0.2)  # the dead worker's last statements reach the database
        on_record = decided_turns(runs)

        scraper.worker_port = free_port()
        replacement = start_worker(
            beat=True, AGENTRUN_WORKER_METRICS_PORT=str(scraper.worker_port), **env
        )
        try:
            wait_until(all_finished(runs), timeout=120, interval=0.5, what="every run to finish")
        except TimeoutError:
            print(explain(runs, doomed, replacement))
            raise

        assert statuses(runs) == {"succeeded": RUNS}, explain(runs, doomed, replacement)
        # Every decision was stored once, and the model was asked again only for the
        # decisions that were not on record when the worker died.
        assert decision_counts(runs) == {1: 3 * RUNS}
        before = requests_per_turn(fake, until=killed_at)
        after = requests_per_turn(fake, since=killed_at)
        assert set(before.values()) == set(after.values()) == {1}
        assert not set(after) & on_record
        assert len(set(before) | set(after)) == 3 * RUNS
        # The kill caught steps waiting on the model: their requests were lost.
        assert len(set(before) & set(after)) >= in_flight // 2

        print(
            "DEBUG in_flight",
            in_flight,
            "paying",
            paying,
            "on_record",
            len(on_record),
            "reasked",
            len(set(before) & set(after)),
            "inv",
            Counter(LedgerInvocation.objects.filter(run__in=runs).values_list("count", flat=True)),
        )
        # Each payment happened once per idempotency key.
        calls = ToolCall.objects.filter(run__in=runs, status="ok")
        keys = list(calls.values_list("idempotency_key", flat=True))
        assert len(keys) == len(set(keys)) == 2 * RUNS
        entries = LedgerEntry.objects.filter(run__in=runs)
        assert sorted(entries.values_list("idempotency_key", flat=True)) == sorted(keys)
        # A payment that landed but never returned was in doubt: being idempotent, it
        # was made again under the same key, which the ledger honoured.
        invocations = Counter(
            LedgerInvocation.objects.filter(run__in=runs).values_list("count", flat=True)
        )
        assert set(invocations) <= {1, 2}
        assert invocations[2] >= paying // 2, (invocations, paying)
        # Scraped all along, through the kill: every exposition parsed, and the last
        # one's runs by status are the database's.
        time.sleep(0.5)  # a scrape after the last run ended
        scraper.stop()
        assert not scraper.failures, scraper.failures[:3]
        assert len(scraper.scrapes) >= 10 and scraper.worker_scrapes >= 3
        last = scraper.scrapes[-1]
        ended = {
            dict(labels)["status"]: value
            for (name, labels), value in last.items()
            if name == "agentrun_runs_ended_total" and dict(labels)["agent"] == "llm"
        }
        assert ended == {"succeeded": RUNS, "failed": 0, "cancelled": 0}
        assert not any(name == "agentrun_runs_active" for name, _ in last)
