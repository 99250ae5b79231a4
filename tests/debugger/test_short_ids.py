"""Pages that ask for a run id take the short id pages show; a bad one is a clear 400/404."""

from __future__ import annotations

import uuid

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run
from tests.base import drive
from tests.debugger import runs

pytestmark = pytest.mark.django_db

TWINS = [uuid.UUID(f"abcd0000-0000-4000-8000-00000000000{n}") for n in (1, 2)]


@pytest.fixture
def family(people):
    parent = runs.walkthrough_run(people["operator"])
    fork = drive(services.fork_run(parent, step=4, user=people["operator"]))
    for pk in TWINS:
        Run.objects.create(id=pk, agent="x")
    return parent, fork


def test_compare_takes_a_short_id(client_for, family):
    parent, fork = family
    response = client_for("viewer").get(f"/runs/{parent.pk}/compare/?with={fork.pk.hex[:6]}")
    assert response.status_code == 200 and response.context["other"] == fork


@pytest.mark.parametrize(
    "text, status, problem",
    [
        ("abcd", 400, "matches several runs"),
        ("ffff0", 400, "no run has an id starting with"),
        ("ab", 400, "too short to name a run"),
        ("<b>x</b>", 400, "is not a valid run id"),
    ],
)
def test_compare_refuses_a_bad_id_with_the_reason(client_for, family, text, status, problem):
    parent, _fork = family
    response = client_for("viewer").get(f"/runs/{parent.pk}/compare/", {"with": text})
    html = response.content.decode()
    assert response.status_code == status and problem in html
    assert "<b>x</b>" not in html


def test_an_ambiguous_id_on_compare_links_each_candidate(client_for, family):
    parent, _fork = family
    html = client_for("viewer").get(f"/runs/{parent.pk}/compare/?with=abcd").content.decode()
    for pk in TWINS:
        assert f'href="/runs/{parent.pk}/compare/?with={pk}"' in html


def test_the_snapshot_diff_takes_short_ids(client_for, family):
    parent, fork = family
    client = client_for("viewer")
    response = client.get(f"/diff/?a={str(parent.pk)[:8]}:6:post&b={fork.pk.hex[:10]}:6:post")
    assert response.status_code == 200
    assert response.context["a"].run_id == parent.pk and response.context["b"].run_id == fork.pk
    refused = client.get(f"/diff/?a=abcd:1:post&b={fork.pk}:6:post")
    assert refused.status_code == 400 and "matches several runs" in refused.content.decode()


def test_an_address_with_a_short_id_redirects_to_the_run(client_for, family):
    parent, _fork = family
    client = client_for("viewer")
    short = str(parent.pk)[:8]
    assert client.get(f"/runs/{short}/")["Location"] == f"/runs/{parent.pk}/"
    response = client.get(f"/runs/{short}/steps/4/diff/?x=1")
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{parent.pk}/steps/4/diff/?x=1"
    upper = client.get(f"/runs/{str(parent.pk).upper()}/compare/")
    assert upper["Location"] == f"/runs/{parent.pk}/compare/"


def test_an_address_with_an_unknown_or_shared_short_id_is_a_404_that_says_why(client_for, family):
    client = client_for("viewer")
    unknown = client.get("/runs/ffff0000/")
    assert unknown.status_code == 404
    assert "No run has an id starting with &#x27;ffff0000&#x27;." in unknown.content.decode()
    shared = client.get("/runs/abcd/steps/1/")
    html = shared.content.decode()
    assert shared.status_code == 404 and "Which run?" in html
    assert all(f'href="/runs/{pk}/steps/1/"' in html for pk in TWINS)


def test_short_id_addresses_need_a_login_and_a_role(client_for, family):
    parent, _fork = family
    short = str(parent.pk)[:8]
    assert client_for(None).get(f"/runs/{short}/")["Location"].startswith("/login/")
    assert client_for("outsider").get(f"/runs/{short}/").status_code == 403
