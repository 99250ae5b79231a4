"""Every page needs a login and a role; mutations need an operator."""

from __future__ import annotations

import pytest

from agentrun.models import Event, Run
from tests.debugger import runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people):
    return runs.walkthrough_run(people["operator"])


def pages(run: Run) -> list[str]:
    r = run.pk
    return [
        "/",
        f"/runs/{r}/",
        f"/runs/{r}/steps/3/",
        f"/runs/{r}/live/",
        f"/runs/{r}/steps/3/pre/",
        f"/runs/{r}/steps/3/post/",
        f"/runs/{r}/steps/3/pre.json",
        f"/runs/{r}/steps/3/diff/",
        f"/runs/{r}/compare/",
        f"/diff/?a={r}:1:pre&b={r}:3:post",
        "/diff/",
        "/audit/",
        "/audit/export.csv",
        "/now/",
    ]


def test_anonymous_visitors_are_sent_to_the_login_page(client_for, run):
    client = client_for(None)
    for url in pages(run):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


@pytest.mark.parametrize("who", ["viewer", "operator", "admin"])
def test_every_role_reads_every_page(client_for, run, who):
    client = client_for(who)
    for url in pages(run):
        response = client.get(url)
        assert response.status_code in (200, 286), url


def test_a_user_without_a_role_gets_403_everywhere(client_for, run):
    client = client_for("outsider")
    for url in pages(run):
        assert client.get(url).status_code == 403, url
    for action in ("cancel", "approval"):
        assert client.post(f"/runs/{run.pk}/{action}/", {"decision": "approve"}).status_code == 403


def test_a_403_page_says_why(client_for, run):
    response = client_for("outsider").get("/")
    assert b"has no role yet" in response.content


def test_a_viewer_posting_an_action_gets_403_and_nothing_changes(client_for, people):
    waiting = runs.waiting_run(people["operator"])
    queued = runs.queued_run(people["operator"])
    client = client_for("viewer")
    events = Event.objects.count()
    assert client.post(f"/runs/{waiting.pk}/approval/", {"decision": "approve"}).status_code == 403
    assert client.post(f"/runs/{queued.pk}/cancel/", {"reason": "no"}).status_code == 403
    assert Run.objects.get(pk=waiting.pk).status == "waiting"
    assert Run.objects.get(pk=queued.pk).status == "queued"
    assert Event.objects.count() == events


def test_actions_refuse_get(client_for, run):
    client = client_for("operator")
    for action in ("cancel", "approval"):
        assert client.get(f"/runs/{run.pk}/{action}/").status_code == 405


def test_actions_need_the_csrf_token(people, run):
    from django.test import Client

    from tests.base import PASSWORD

    client = Client(enforce_csrf_checks=True)
    client.login(username="olga", password=PASSWORD)
    queued = runs.queued_run(people["operator"])
    assert client.post(f"/runs/{queued.pk}/cancel/", {"reason": "x"}).status_code == 403
    assert Run.objects.get(pk=queued.pk).status == "queued"


def test_viewers_see_no_mutating_controls(client_for, people):
    waiting = runs.waiting_run(people["operator"])
    html = client_for("viewer").get(f"/runs/{waiting.pk}/").content.decode()
    assert "An operator must decide" in html
    assert 'data-action="approve"' not in html and 'data-action="cancel"' not in html
    operator_html = client_for("operator").get(f"/runs/{waiting.pk}/").content.decode()
    assert 'data-action="approve"' in operator_html and 'data-action="cancel"' in operator_html


def test_replay_from_here_is_for_operators_only(client_for, run):
    url = f"/runs/{run.pk}/steps/3/pre/"
    assert 'data-action="replay"' not in client_for("viewer").get(url).content.decode()
    html = client_for("operator").get(url).content.decode()
    assert f'href="/runs/{run.pk}/steps/3/pre/fork/" data-action="replay"' in html
    assert client_for("viewer").get(f"/runs/{run.pk}/steps/3/pre/fork/").status_code == 403


def test_unknown_runs_steps_and_bad_ids_are_404(client_for, run):
    client = client_for("viewer")
    missing = "00000000-0000-4000-8000-000000000000"
    for url in (
        f"/runs/{missing}/",
        f"/runs/{missing}/steps/1/",
        f"/runs/{run.pk}/steps/99/",
        f"/runs/{run.pk}/steps/99/pre/",
        f"/runs/{run.pk}/steps/99/diff/",
        f"/runs/{missing}/live/",
        "/runs/not-a-uuid/",
        "/runs/1234/steps/1/",
        f"/runs/{run.pk}/steps/1/sideways/",
        f"/runs/{run.pk}/steps/3/pre/?path=nope.x",
    ):
        assert client.get(url).status_code == 404, url
    # A run named in the diff form is the form's error: said on the page, with a 400.
    response = client.get(f"/diff/?a={missing}:1:pre&b={run.pk}:1:post")
    assert response.status_code == 400 and f"no run {missing}" in response.content.decode()


def test_pages_send_a_content_security_policy(client_for, run):
    response = client_for("viewer").get(f"/runs/{run.pk}/")
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    html = response.content.decode()
    assert (
        '"selfRequestsOnly":true' in html
        and '"allowEval":false' in html
        and '"allowScriptTags":false' in html
    )
