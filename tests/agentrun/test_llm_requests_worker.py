"""A long conversation on a real worker: every request a decision records is rebuilt to the
exact bytes the provider received, none holds the messages again, and a fork at turn 30
shares its parent's messages and rebuilds its own requests too."""

from __future__ import annotations

import json

import pytest

from agentrun.builtin import llm_requests
from agentrun.lifecycle import services
from agentrun.models import Step
from tests.agentrun.llm_load import llm_env
from tests.fake_openai import FakeOpenAI, completion, tool_call
from tests.workers import Worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TURNS = 60
GOAL = "Read the pages one by one, then answer."


def model(request):
    """One page a turn (each tool result a different text of 2 KB), then the answer. The
    turn is read from the last tool result's call id: the window drops the oldest turns."""
    last = request.json["messages"][-1]
    turn = int(last["tool_call_id"].split("_")[1]) + 1 if last["role"] == "tool" else 0
    if turn >= TURNS:
        return completion("read them all")
    text = f"page {turn}: " + "lorem ipsum dolor sit amet " * 80
    return completion(tool_calls=[tool_call("echo", {"text": text}, id=f"call_{turn}")])


def test_every_request_of_a_long_conversation_and_of_its_fork_rebuilds_exactly(tmp_path, settings):
    settings.AGENTRUN_ENQUEUE = True
    with FakeOpenAI(respond=model) as fake:
        worker = Worker(tmp_path, **llm_env(fake))
        try:
            run = services.start_run("llm", {"goal": GOAL, "tools": ["echo"]})
            wait_until(lambda: run.__class__.objects.get(pk=run.pk).status == "succeeded",
                       timeout=180, what="60 turns")  # fmt: skip
            steps = list(Step.objects.filter(run=run).order_by("number"))
            sent = [r.body for r in fake.chat_requests()]  # the one run, in order
            assert len(steps) == len(sent) == TURNS + 1
            for step, body in zip(steps, sent, strict=True):
                assert llm_requests.rebuild(step).bytes == body, step.number
            # The later requests left the oldest turns out of the window, and say so.
            assert steps[-1].decision["llm"]["request"]["dropped_messages"] > 0
            # No message is stored twice: the decisions name positions, they hold no text.
            total = sum(len(json.dumps(s.decision["llm"]["request"])) for s in steps)
            assert total < 200 * len(steps) + 2000  # the tool definitions once
            assert sum(len(b) for b in sent) > 60 * 60 * 2000 / 2  # the context grew

            fork = services.fork_run(run, step=31, at="pre", mode="sandbox")
            wait_until(lambda: fork.__class__.objects.get(pk=fork.pk).status == "succeeded",
                       timeout=120, what="the fork")  # fmt: skip
            fork_steps = list(Step.objects.filter(run=fork).order_by("number"))
            fork_sent = [r.body for r in fake.chat_requests()][len(sent) :]
            assert len(fork_steps) == len(fork_sent) == TURNS + 1 - 30
            for step, body in zip(fork_steps, fork_sent, strict=True):
                assert llm_requests.rebuild(step).bytes == body, step.number
            # The fork's first request is its parent's at the same step: the same messages.
            assert fork_sent[0] == sent[30]
            assert (
                llm_requests.rebuild(fork_steps[0]).positions
                == llm_requests.rebuild(steps[30]).positions
            )
        finally:
            worker.stop()
