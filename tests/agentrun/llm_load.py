"""Many `llm` runs at once against one FakeOpenAI: helpers for the scale tests.

Each run's goal names it ("run 17: ..."), so the fake tells the conversations
apart by their user message, and the turn of a conversation by how many tool
results it already carries (one tool call per turn in these tests).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from django.db import connection

from agentrun.lifecycle import services
from agentrun.models import Run, Step
from tests.fake_openai import FakeOpenAI, Recorded

API_KEY = "scale-test-key-0123456789"
ACTIVE = ("queued", "running", "waiting")


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


def goal(i: int) -> str:
    return f"run {i}: do what the model says, then answer."


def goal_of(request: Recorded) -> str:
    """The conversation a request belongs to: its (first) user message."""
    return next(m["content"] for m in request.json["messages"] if m["role"] == "user")


def turn_of(request: Recorded) -> int:
    """0 for a conversation's first request, then one more per tool result in it."""
    return sum(1 for m in request.json["messages"] if m["role"] == "tool")


def spread(request: Recorded, low: float, high: float) -> float:
    """A latency between low and high, the same every time for one (conversation, turn)."""
    h = zlib.crc32(f"{goal_of(request)}|{turn_of(request)}".encode()) % 1000
    return low + (high - low) * h / 999


def start_runs(n: int, tools: list[str]) -> list[Run]:
    return [services.start_run("llm", {"goal": goal(i), "tools": tools}) for i in range(n)]


def llm_env(fake: FakeOpenAI, **extra: str) -> dict[str, str]:
    """What a worker needs to talk to the fake."""
    return {
        "AGENTRUN_LLM_BASE_URL": fake.base_url,
        "AGENTRUN_LLM_API_KEY": API_KEY,
        "AGENTRUN_LLM_MODEL": "fake-model",
        **extra,
    }


def all_finished(runs: list[Run]) -> Callable[[], bool]:
    ids = [r.pk for r in runs]
    return lambda: not Run.objects.filter(pk__in=ids, status__in=ACTIVE).exists()


def statuses(runs: list[Run]) -> Counter[str]:
    return Counter(Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True))


def requests_per_turn(
    fake: FakeOpenAI, since: float = 0.0, until: float = float("inf")
) -> Counter[tuple[str, int]]:
    """How many chat requests the fake got for each (conversation, turn), in a time window."""
    return Counter((goal_of(r), turn_of(r)) for r in fake.chat_requests() if since <= r.at < until)


def decided_turns(runs: list[Run]) -> set[tuple[str, int]]:
    """The (conversation, turn) of every step whose decision is on record: step n is turn n-1."""
    goals = {r.pk: r.input["goal"] for r in runs}
    rows = Step.objects.filter(run__in=runs, decision__isnull=False).values_list("run_id", "number")
    return {(goals[run_id], number - 1) for run_id, number in rows}


def decision_counts(runs: list[Run]) -> Counter[int]:
    """How many steps were decided how many times (all once: {1: steps})."""
    return Counter(Step.objects.filter(run__in=runs).values_list("decision_count", flat=True))


def explain(runs: list[Run], *workers: Any) -> str:
    """What a failed wait shows: the runs' statuses and the end of each worker's log."""
    logs = "\n".join(f"--- {w.name} ---\n{w.text()[-4000:]}" for w in workers)
    return f"statuses: {dict(statuses(runs))}\n{logs}"
