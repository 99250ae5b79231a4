"""The HTML forms refuse what the database can't store, as the API does: never a 500,
never a half-done action."""

import json

from agentrun.models import Event, Run
from tests.debugger import runs
from tests.debugger.test_fork_views import fork_url, state_of


def test_a_fork_whose_edited_state_holds_a_nul_is_refused_with_a_message(client_for, people):
    parent = runs.walkthrough_run(people["operator"])
    state = state_of(parent)
    state["memory"]["goal"] = "ship\u0000it"
    before = Run.objects.count(), Event.objects.count()
    response = client_for("operator").post(
        fork_url(parent), {"mode": "sandbox", "reason": "", "state": json.dumps(state)}
    )
    assert response.status_code == 400
    assert "contains a NUL character" in response.content.decode()
    assert (Run.objects.count(), Event.objects.count()) == before


def test_cancelling_with_a_nul_in_the_reason_is_refused_and_says_why(client_for, people):
    run = runs.queued_run(people["operator"])
    response = client_for("operator").post(
        f"/runs/{run.pk}/cancel/", {"reason": "dup\u0000licate"}, follow=True
    )
    assert b"Not cancelled: the reason was refused: null characters are not allowed" in (
        response.content
    )
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert not Event.objects.filter(run=run, kind="run_cancelled").exists()


def test_an_approval_with_an_invalid_comment_says_what_is_wrong(client_for, people):
    run = runs.waiting_run(people["operator"])
    response = client_for("operator").post(
        f"/runs/{run.pk}/approval/", {"decision": "approve", "comment": "ok\u0000"}, follow=True
    )
    assert b"Not decided: the comment was refused: null characters are not allowed" in (
        response.content
    )
    assert Run.objects.get(pk=run.pk).status == "waiting"
