"""An llm step's request on its own page: as sent (the exact bytes a click away), the
messages it added to the previous request marked, those the window dropped listed."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.models import Step
from tests.agentrun.llm_load import API_KEY
from tests.base import drive, make_people, make_run, script
from tests.fake_openai import FakeOpenAI, completion, tool_call

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake(settings, monkeypatch):
    with FakeOpenAI() as server:
        settings.AGENTRUN_LLM_BASE_URL = server.base_url
        monkeypatch.setenv("AGENTRUN_LLM_API_KEY", API_KEY)
        yield server


def viewer():
    client = Client()
    client.force_login(make_people()["viewer"])
    return client


def test_the_request_page_shows_what_was_sent_and_what_is_new(fake):
    from agentrun.lifecycle import services

    fake.push(completion(tool_calls=[tool_call("echo", {"text": "hi"})]), completion("done"))
    run = drive(services.start_run("llm", {"goal": "Say hi through echo.", "tools": ["echo"]}))
    client = viewer()
    page = client.get(f"/runs/{run.pk}/steps/2/request/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Compared with the previous request (step 1)" in html
    assert "2 messages added, none fell out of the context window" in html
    assert html.count('class="msg added"') == 2 and "history[3]" in html
    raw = client.get(f"/runs/{run.pk}/steps/2/request/?raw=1")
    assert raw.content == fake.chat_requests()[1].body
    assert client.get(f"/runs/{run.pk}/steps/2/").content.decode().count("/request/") == 1


def test_a_step_that_asked_no_model_has_no_request_page():
    run = drive(make_run(script({"thought": "t", "final": "x"})))
    assert Step.objects.filter(run=run).exists()
    assert viewer().get(f"/runs/{run.pk}/steps/1/request/").status_code == 404
