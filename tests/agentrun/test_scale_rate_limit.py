"""A rate-limiting provider is waited for as long as it asks, and not stampeded.

On HTTP 429 with Retry-After the engine parks the step at least that long, the
same decision still to be made (`retry_scheduled` says how long and why), and a
process never has more requests in flight to the provider than
AGENTRUN_LLM_MAX_CONCURRENCY.
"""

import datetime
import email.utils
import threading
from collections import Counter, defaultdict

import pytest

from agentrun import engine
from agentrun.agents import StepContext, get_agent
from agentrun.builtin.llm import retry_after_seconds
from agentrun.models import Event, Step
from tests.agentrun.llm_load import (
    API_KEY,
    all_finished,
    decision_counts,
    explain,
    goal,
    goal_of,
    llm_env,
    start_runs,
    statuses,
    turn_of,
)
from tests.base import drive
from tests.fake_openai import FakeOpenAI, Recorded, Reply, completion, error, tool_call
from tests.workers import wait_until

RUNS = 5
LIMITED = 2  # each conversation's first requests are refused


def rate_limited(status: int = 429, **headers: str) -> Reply:
    reply = error(status, "Rate limit reached, try again later", "rate_limit_exceeded")
    reply.headers.update(headers)
    return reply


class LimitingModel:
    """Refuses each conversation's first LIMITED requests with 429 Retry-After: 1."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request: Recorded) -> Reply:
        with self.lock:
            self.seen[goal_of(request)] += 1
            refused = self.seen[goal_of(request)] <= LIMITED
        if refused:
            return rate_limited(**{"Retry-After": "1"})
        if turn_of(request) == 0:
            return Reply(200, completion(tool_calls=[tool_call("echo", {"n": 1})]))
        return Reply(200, completion("echoed"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_rate_limited_run_waits_as_long_as_the_provider_asks_and_finishes(start_worker):
    with FakeOpenAI(respond=LimitingModel()) as fake:
        runs = start_runs(RUNS, tools=["echo"])
        worker = start_worker(beat=True, **llm_env(fake))
        try:
            wait_until(all_finished(runs), timeout=60, interval=0.2, what="every run to finish")
        except TimeoutError:
            print(explain(runs, worker))
            raise

    assert statuses(runs) == {"succeeded": RUNS}, explain(runs, worker)
    assert decision_counts(runs) == {1: 2 * RUNS}
    retries = defaultdict(list)
    for event in Event.objects.filter(run__in=runs, kind="retry_scheduled").order_by("pk"):
        retries[event.run.input["goal"]].append(event.payload)
    asked = defaultdict(list)
    for request in fake.chat_requests():
        asked[goal_of(request)].append(request.at)
    for i in range(RUNS):
        # Step 1 was refused twice, each refusal recorded with the wait it asked for...
        scheduled = retries[goal(i)]
        assert [p["attempt"] for p in scheduled] == [1, 2]
        assert [p["retry_after_s"] for p in scheduled] == [1, 1]
        assert all(p["backoff_s"] >= 1 for p in scheduled), scheduled
        assert all("HTTP 429" in p["error"] for p in scheduled), scheduled
        # ... and the provider was asked again only after that wait.
        first, second, third, _ = asked[goal(i)]
        assert second - first >= scheduled[0]["backoff_s"]
        assert third - second >= scheduled[1]["backoff_s"]
    step_attempts = Step.objects.filter(run__in=runs, number=1).values_list("attempts", flat=True)
    assert set(step_attempts) == {LIMITED + 1}


@pytest.mark.django_db
def test_a_retry_after_that_is_not_a_number_backs_off_as_usual(settings, monkeypatch):
    """`retry-after-ms: nan` once crashed the step (timedelta(seconds=nan)), and the
    reconciler would have retried that crash forever."""
    with FakeOpenAI() as fake:
        settings.AGENTRUN_LLM_BASE_URL = fake.base_url
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        fake.push(rate_limited(**{"retry-after-ms": "nan"}), completion("fine now"))
        run = start_runs(1, tools=["echo"])[0]
        outcome = engine.execute_step(run.pk, 1)
        assert outcome.status == "backoff", outcome
        event = Event.objects.get(run=run, kind="retry_scheduled")
        assert "retry_after_s" not in event.payload
        assert event.payload["backoff_s"] == engine.decide.DECIDE_RETRY.delay(1)
        assert drive(run, through_backoff=True).status == "succeeded"


def http_date(seconds_from_now: float) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return email.utils.format_datetime(when, usegmt=True)


# Names in lower case: the SDK's response headers are case-insensitive, a dict is not.
@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "1"}, 1.0),
        ({"retry-after": " 2.5 "}, 2.5),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "1500", "retry-after": "7"}, 1.5),  # the precise one wins
        ({"retry-after-ms": "-20"}, 0.0),
        ({"retry-after": http_date(-60)}, 0.0),  # a date gone by: now
        ({}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "1e3"}, None),
        ({"retry-after": "Mon, 99 Foo 2026 25:61:00 GMT"}, None),
        ({"retry-after-ms": "later"}, None),
        ({"retry-after-ms": "nan"}, None),
        ({"retry-after-ms": "inf"}, None),
    ],
)
def test_retry_after_is_read_from_the_providers_headers(headers, seconds):
    assert retry_after_seconds(headers) == seconds


def test_retry_after_as_an_http_date_is_the_time_left_until_then():
    # An HTTP date has whole seconds: 30 s from now is 29 to 30 s away.
    assert 29 <= retry_after_seconds({"retry-after": http_date(30)}) <= 30


def test_requests_in_flight_never_exceed_the_processs_cap(settings, monkeypatch):
    settings.AGENTRUN_LLM_MAX_CONCURRENCY = 3
    with FakeOpenAI(respond=lambda request: Reply(200, completion("ok"), delay=0.3)) as fake:
        settings.AGENTRUN_LLM_BASE_URL = fake.base_url
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        agent = get_agent("llm")
        decisions = []

        def decide(i: int) -> None:
            inp = {"goal": goal(i), "tools": []}
            decisions.append(agent.decide(agent.initial_state(inp), StepContext(f"r{i}", 1, inp)))

        threads = [threading.Thread(target=decide, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)

    assert len(fake.chat_requests()) == len(decisions) == 20
    assert fake.peak_in_flight == 3
    # The others waited for a slot, and their decisions say how long.
    queued = [d.llm["queued_ms"] for d in decisions if "queued_ms" in d.llm]
    assert len(queued) >= 20 - 3 - 1 and max(queued) >= 5 * 300 * 0.9, queued
