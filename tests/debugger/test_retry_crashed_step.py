"""A run whose step kept crashing says so on its page, and an operator retries it there."""

from django.test import Client

from agentrun import engine
from agentrun.models import Event, Run
from tests.base import calls, final, make_run, script


def _crashed_run(user):
    run = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()), user=user)
    Run.objects.filter(pk=run.pk).update(agent="weather")  # a worker without the agent's module
    assert engine.execute_step(run.pk, 1).status == "waiting"
    Run.objects.filter(pk=run.pk).update(agent="scripted")  # ...and now the workers have it
    return run


def test_the_page_shows_why_and_an_operator_retries_the_step(client_for, people):
    run = _crashed_run(people["operator"])
    page = client_for("operator").get(f"/runs/{run.pk}/").content.decode()
    assert "waiting · crashed" in page
    assert "unknown agent &#x27;weather&#x27;" in page and "AGENTRUN_AGENT_MODULES" in page
    assert 'data-action="retry"' in page

    response = client_for("operator").post(
        f"/runs/{run.pk}/retry/", {"reason": "deployed the weather module"}, follow=True
    )
    assert b"The step will be tried again" in response.content
    run.refresh_from_db()
    assert (run.status, run.wait_reason) == ("running", "")
    event = Event.objects.get(run=run, kind="step_retried")
    assert (event.user, event.reason) == (people["operator"], "deployed the weather module")
    assert engine.execute_step(run.pk, 1).status in ("committed", "finished")


def test_a_viewer_sees_no_retry_button_and_cannot_retry(client_for, people):
    run = _crashed_run(people["operator"])
    page = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert 'data-action="retry"' not in page
    response = client_for("viewer").post(f"/runs/{run.pk}/retry/")
    assert response.status_code == 403
    assert Run.objects.get(pk=run.pk).wait_reason == "crashed"


def test_the_api_retries_a_crashed_run_and_refuses_any_other(people):
    run = _crashed_run(people["operator"])
    client = Client()
    client.force_login(people["operator"])
    response = client.post(
        f"/api/runs/{run.pk}/retry", {"reason": "fixed"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "running"
    again = client.post(f"/api/runs/{run.pk}/retry", {}, content_type="application/json")
    assert again.status_code == 409
    assert "only a run waiting after its step crashed" in again.json()["detail"]
