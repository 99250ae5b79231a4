"""Pins and retention in the debugger: pin/unpin from the run page (operators only), the
runs page's pinned filter, when a run will be purged, and a purged run's page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.lifecycle import retention, services
from agentrun.models import Event, Run, ToolCall
from tests.debugger import runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def done(people):
    return runs.walkthrough_run(people["operator"])


def test_an_operator_pins_a_run_from_its_page_and_the_audit_shows_it(client_for, people, done):
    client = client_for("operator")
    page = client.get(f"/runs/{done.pk}/").content.decode()
    assert f'action="/runs/{done.pk}/pin/"' in page and "Purged after" in page

    response = client.post(f"/runs/{done.pk}/pin/", {"reason": "incident #123"}, follow=True)

    assert response.redirect_chain == [(f"/runs/{done.pk}/", 302)]
    html = response.content.decode()
    assert "Pinned: retention keeps this run" in html
    assert "Kept: <strong hx-disable>incident #123</strong>" in html
    assert f'action="/runs/{done.pk}/unpin/"' in html and "Purged after" not in html
    done.refresh_from_db()
    assert (done.pin_reason, done.pinned_by) == ("incident #123", people["operator"])
    audit = client_for("viewer").get("/audit/")
    pins = [e for e in audit.context["actions"] if e.kind == "run_pinned"]
    assert [(e.actor, e.reason, e.run_id) for e in pins] == [("olga", "incident #123", done.pk)]
    assert "incident #123" in audit.content.decode()


def test_a_pin_without_a_reason_is_refused_and_changes_nothing(client_for, done):
    client = client_for("operator")
    for reason in ("", "   "):
        response = client.post(f"/runs/{done.pk}/pin/", {"reason": reason}, follow=True)
        assert b"Not pinned: the reason was refused: a pin needs a reason" in response.content
    response = client.post(f"/runs/{done.pk}/pin/", {"reason": "x" * 2001}, follow=True)
    assert b"Not pinned: the reason was refused" in response.content
    assert Run.objects.get(pk=done.pk).pinned_at is None
    assert not Event.objects.filter(kind="run_pinned").exists()


def test_a_viewer_sees_no_pin_form_and_may_not_post_one(client_for, people, done):
    viewer = client_for("viewer")
    page = viewer.get(f"/runs/{done.pk}/").content.decode()
    assert "/pin/" not in page and "Purged after" in page
    assert viewer.post(f"/runs/{done.pk}/pin/", {"reason": "mine"}).status_code == 403
    services.pin_run(done, user=people["admin"], reason="incident #9")
    assert viewer.post(f"/runs/{done.pk}/unpin/", {}).status_code == 403
    assert client_for(None).post(f"/runs/{done.pk}/pin/", {"reason": "x"}).status_code == 302
    assert Run.objects.get(pk=done.pk).pin_reason == "incident #9"


def test_an_operator_unpins_from_the_page(client_for, people, done):
    services.pin_run(done, user=people["admin"], reason="incident #9")
    response = client_for("operator").post(
        f"/runs/{done.pk}/unpin/", {"reason": "closed"}, follow=True
    )
    assert b"Unpinned" in response.content
    assert Run.objects.get(pk=done.pk).pinned_at is None
    assert Event.objects.get(kind="run_unpinned").reason == "closed"
    response = client_for("operator").post(f"/runs/{done.pk}/unpin/", {}, follow=True)
    assert b"Not unpinned: the run is not pinned" in response.content


def test_the_runs_page_lists_only_pinned_runs_on_request(client_for, people, done):
    other = runs.walkthrough_run(people["operator"])
    services.pin_run(done, user=people["operator"], reason="incident #123")
    client = client_for("viewer")
    assert {r.pk for r in client.get("/?pinned=1").context["page"]} == {done.pk}
    everything = client.get("/")
    assert {r.pk for r in everything.context["page"]} == {done.pk, other.pk}
    assert everything.content.decode().count('class="badge pin"') == 1


def test_a_run_kept_by_its_pinned_fork_says_so(client_for, people, done):
    fork = services.fork_run(done, step=1, at="post", user=people["operator"])
    services.pin_run(fork, user=people["operator"], reason="incident #77")
    html = client_for("viewer").get(f"/runs/{done.pk}/").content.decode()
    assert "Kept while its fork relative" in html and "incident #77" in html


def test_a_purged_run_shows_what_the_audit_kept(client_for, people):
    failed = runs.failing_run(people["admin"])  # a reserve (hybrid), compensated
    Run.objects.filter(pk=failed.pk).update(finished_at=timezone.now() - timedelta(days=40))
    assert retention.purge(timedelta(days=30)).runs == 1
    client = client_for("viewer")
    key = ToolCall.objects.get(run=failed, tool="reserve").idempotency_key
    for url in (f"/runs/{failed.pk}/", f"/runs/{failed.pk}/steps/1/"):
        response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert "Retention purged this run" in html and key in html
        assert "run_created" in html and "/pin/" not in html
    assert client.get(f"/runs/{failed.pk}/steps/1/pre/").status_code == 404
    audit = client.get(f"/audit/?run={failed.pk}")
    assert key in audit.content.decode()
    # The pin form is gone for operators too: there is nothing left to keep.
    assert "/pin/" not in client_for("operator").get(f"/runs/{failed.pk}/").content.decode()


def test_compare_with_a_purged_run_says_so_instead_of_failing(client_for, people):
    kept = runs.walkthrough_run(people["operator"])
    gone = runs.walkthrough_run(people["operator"])
    Run.objects.filter(pk=gone.pk).update(finished_at=timezone.now() - timedelta(days=40))
    assert retention.purge(timedelta(days=30)).run_ids == [gone.pk]
    client = client_for("viewer")
    response = client.get(f"/runs/{kept.pk}/compare/?with={gone.pk}")
    assert response.status_code == 400
    assert b"was purged by retention: no states to compare" in response.content
    response = client.get(f"/runs/{gone.pk}/compare/?with={kept.pk}")
    assert response.status_code == 200 and b"Retention purged this run" in response.content
    assert client.get(f"/runs/{gone.pk}/steps/2/diff/").status_code == 404
