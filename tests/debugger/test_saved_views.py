"""Saved views: an operator names the run list's filter, finds it above the list, opens it by
its link and deletes it; bad input is refused and changes nothing."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from agentrun.models import SavedView
from tests.base import calls, drive, final, make_run, script

pytestmark = pytest.mark.django_db


def failed_run():
    return drive(
        make_run(script(calls({"tool": "fail", "args": {"message": "declined"}}), final()))
    )


def save(client, name, **query):
    return client.post("/views/", {"name": name, "query": urlencode(query, doseq=True)})


def test_an_operator_saves_the_filter_and_opens_it_again(client_for, people):
    failed, ok = failed_run(), drive(make_run())
    client = client_for("operator")
    assert 'data-action="save-view"' in client.get("/?status=failed").content.decode()

    response = save(client, "  Failing payments ", status="failed", error="declined")
    assert response.status_code == 302
    assert response["Location"] == "/?status=failed&error=declined"
    (view,) = SavedView.objects.all()
    assert (view.owner, view.name) == (people["operator"], "Failing payments")
    assert view.query == {"status": "failed", "error": "declined"}

    html = client.get("/").content.decode()
    assert 'href="/?status=failed&amp;error=declined"' in html and "Failing payments" in html
    page = client.get("/?status=failed&error=declined").content.decode()
    assert 'aria-current="true">Failing payments' in page
    assert str(failed.pk)[:8] in page and str(ok.pk)[:8] not in page

    # The same name again: its filter is replaced, not a second view made.
    save(client, "Failing payments", status="failed")
    assert SavedView.objects.get().query == {"status": "failed"}


def test_views_are_each_operators_own(client_for, people):
    olga = client_for("operator")
    save(olga, "Mine", status="failed")
    view = SavedView.objects.get()
    ada = client_for("admin")
    assert "Mine" not in ada.get("/").content.decode()
    assert ada.post(f"/views/{view.pk}/delete/").status_code == 404
    assert SavedView.objects.filter(pk=view.pk).exists()
    assert olga.post(f"/views/{view.pk}/delete/").status_code == 302
    assert not SavedView.objects.exists()


def test_a_viewer_cannot_save_a_view(client_for):
    victor = client_for("viewer")
    assert 'data-action="save-view"' not in victor.get("/?status=failed").content.decode()
    assert save(victor, "Mine", status="failed").status_code == 403
    assert not SavedView.objects.exists()


@pytest.mark.parametrize(
    "name, query",
    [
        ("", {"status": "failed"}),
        ("   ", {"status": "failed"}),
        ("x" * 101, {"status": "failed"}),
        ("Bad status", {"status": "bogus"}),
        ("Bad date", {"since": "yesterday-ish"}),
    ],
)
def test_bad_input_is_refused_and_saves_nothing(client_for, name, query):
    client = client_for("operator")
    response = save(client, name, **query)
    assert response.status_code == 302
    assert not SavedView.objects.exists()
    page = client.get(response["Location"]).content.decode()
    assert "Not saved" in page


def test_an_operator_keeps_a_bounded_number_of_views(client_for, people):
    client = client_for("operator")
    SavedView.objects.bulk_create(
        SavedView(owner=people["operator"], name=f"v{i}", query={"agent": "scripted"})
        for i in range(SavedView.MAX_PER_OWNER)
    )
    save(client, "one more", status="failed")
    assert SavedView.objects.count() == SavedView.MAX_PER_OWNER
    save(client, "v3", status="failed")  # replacing one is still fine
    assert SavedView.objects.get(name="v3").query == {"status": "failed"}


def test_saving_and_deleting_need_post(client_for):
    client = client_for("operator")
    assert client.get("/views/").status_code == 405
    assert client.get("/views/1/delete/").status_code == 405
