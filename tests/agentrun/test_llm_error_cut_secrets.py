"""A provider's error text is cut short before it is stored, and the API key is taken out
of it first: a key that straddles the cut leaves no piece of itself anywhere."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import services
from tests.agentrun.test_llm_agent import stored_text
from tests.base import drive
from tests.fake_openai import FakeOpenAI, Reply, error

# Shaped like no known token, so only the scrubbing of the key itself can hide it.
API_KEY = "arllm-" + "k3y-5c1d9e7a3f0b62d8e4a1"
PREFIX = API_KEY[:8]  # the key starts 10 characters before each cut


@pytest.fixture
def fake(settings, monkeypatch):
    with FakeOpenAI() as server:
        settings.AGENTRUN_LLM_BASE_URL = server.base_url
        settings.AGENTRUN_LLM_MODEL = "fake-model"
        settings.AGENTRUN_LLM_TIMEOUT = 5.0
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        yield server


def failed_run_text(fake: FakeOpenAI, reply: Reply) -> str:
    fake.push(reply)
    run = drive(services.start_run("llm", {"goal": "hi"}))
    assert run.status == "failed", run.error
    return stored_text()


@pytest.mark.django_db
def test_a_key_across_the_messages_cut_leaves_no_prefix(fake):
    # The message is cut to 299 characters and an ellipsis.
    message = "x" * 288 + f" {API_KEY} is not valid"
    text = failed_run_text(fake, error(401, message, "invalid_request_error"))

    assert "HTTP 401" in text
    assert PREFIX not in text


@pytest.mark.django_db
def test_a_key_across_the_error_bodys_cut_leaves_no_prefix(fake):
    # The body kept in the failure's detail is cut at 4,000 characters.
    body = '{"error": {"message": "' + "y" * 3966 + f" {API_KEY}" + '", "type": "x"}}'
    text = failed_run_text(fake, Reply(401, body))

    assert "yyyy" in text
    assert PREFIX not in text


@pytest.mark.django_db
def test_a_key_across_a_non_json_bodys_cut_leaves_no_prefix(fake):
    body = "z" * 3989 + f" {API_KEY} ..."
    text = failed_run_text(fake, Reply(200, body))

    assert "zzzz" in text
    assert PREFIX not in text
