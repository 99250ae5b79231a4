"""The run list's built-in triage views: runs failing repeatedly (the same error across runs
in a window), runs stuck longer than T, and runs waiting for a worker; each a filter with a
shareable link and a count above the list, and bad values refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.lifecycle import selection
from agentrun.models import Run
from tests.base import calls, drive, final, make_run, script

pytestmark = pytest.mark.django_db


def failing(message: str) -> Run:
    return drive(make_run(script(calls({"tool": "fail", "args": {"message": message}}), final())))


def ids(response) -> set[str]:
    return {str(r.pk) for r in response.context["page"].object_list}


def chips(response) -> dict[str, int]:
    return {b["name"]: b["count"] for b in response.context["builtin_views"]}


def test_failing_repeatedly_is_an_error_three_runs_of_the_day_share(client_for):
    declined = [failing("card declined") for _ in range(3)]
    failing("out of stock")
    failing("out of stock")
    drive(make_run())
    old = failing("card declined")  # the same error, but two days ago: out of the window
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=2))

    client = client_for("viewer")
    response = client.get("/?repeated=24")
    assert ids(response) == {str(r.pk) for r in declined}
    assert chips(response)["Failing repeatedly"] == 3
    assert response.context["builtin_views"][0]["current"]
    # A wider window takes the old one in too.
    assert ids(client.get("/?repeated=72")) == {str(r.pk) for r in [*declined, old]}
    # And it narrows like any filter (a tool whose call failed, an agent...).
    assert ids(client.get("/?repeated=24&error=stock")) == set()


def test_stuck_is_not_ended_and_unchanged_for_longer_than_t(client_for):
    stuck = make_run()
    fresh = make_run()
    ended = drive(make_run())
    long_ago = timezone.now() - timedelta(hours=2)
    Run.objects.filter(pk__in=[stuck.pk, ended.pk]).update(updated_at=long_ago)

    response = client_for("viewer").get("/?stuck=60")
    assert ids(response) == {str(stuck.pk)}
    assert str(fresh.pk) not in ids(response)
    assert "Stuck &gt; 60 min" in response.content.decode()
    assert ids(client_for("viewer").get("/?stuck=180")) == set()


def test_waiting_for_a_worker_is_due_and_held_by_nobody(client_for):
    queued = make_run()
    leased = make_run()
    Run.objects.filter(pk=leased.pk).update(
        status="running", lease_owner="w1:1", lease_expires_at=timezone.now() + timedelta(minutes=1)
    )
    expired = make_run()
    Run.objects.filter(pk=expired.pk).update(
        status="running", lease_owner="w9:9", lease_expires_at=timezone.now() - timedelta(minutes=1)
    )
    due = make_run()
    Run.objects.filter(pk=due.pk).update(
        status="waiting", wait_reason="backoff", wake_at=timezone.now() - timedelta(seconds=5)
    )
    later = make_run()
    Run.objects.filter(pk=later.pk).update(
        status="waiting", wait_reason="backoff", wake_at=timezone.now() + timedelta(minutes=5)
    )
    drive(make_run())

    response = client_for("viewer").get("/?no_worker=1")
    assert ids(response) == {str(r.pk) for r in (queued, expired, due)}
    assert chips(response)["Waiting for a worker"] == 3


def test_the_views_are_links_above_the_list_and_kept_by_the_form(client_for):
    html = client_for("viewer").get("/").content.decode()
    assert 'href="/?repeated=24"' in html
    assert 'href="/?stuck=60"' in html
    assert 'href="/?no_worker=1"' in html
    # Narrowing a view with the form keeps the view.
    html = client_for("viewer").get("/?stuck=60&status=queued").content.decode()
    assert '<input type="hidden" name="stuck" value="60">' in html


@pytest.mark.parametrize(
    "query, field",
    [
        ({"stuck": "0"}, "stuck"),
        ({"stuck": "ten"}, "stuck"),
        ({"repeated": "-1"}, "repeated"),
        ({"repeated": str(selection.MAX_HOURS + 1)}, "repeated"),
    ],
)
def test_a_bad_value_is_refused_and_lists_nothing(client_for, query, field):
    make_run()
    response = client_for("viewer").get("/", query)
    assert response.status_code == 200
    assert response.context["page"].paginator.count == 0
    assert field in response.context["form"].errors
    with pytest.raises(selection.SelectionError) as raised:
        selection.parse(query)
    assert raised.value.field == field


def test_the_shared_definition_refuses_a_flag_that_is_not_one():
    # (The page's checkbox, as "Pinned only", takes any value as ticked.)
    with pytest.raises(selection.SelectionError) as raised:
        selection.parse({"no_worker": "maybe"})
    assert raised.value.field == "no_worker"
