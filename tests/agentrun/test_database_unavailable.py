"""While the database can't be reached, the API and the pages answer 503 with Retry-After
and a plain message, never a 500 or a traceback (PostgreSQL restarts:
test_database_restart_answers_503.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from agentrun.infra.outage import MESSAGE
from agentrun.models import ApiToken
from tests.base import make_people, make_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "sqlite",
        reason="an embedded database made unreachable by its path; PostgreSQL's own restart "
        "is test_database_restart_answers_503.py",
    ),
]


@pytest.fixture
def unreachable(tmp_path):
    """The database file out of reach for the test's duration."""

    def cut() -> None:
        connection.close()
        connection.settings_dict["NAME"] = str(tmp_path / "no-such-dir" / "db.sqlite3")

    name = connection.settings_dict["NAME"]
    yield cut
    connection.close()
    connection.settings_dict["NAME"] = name


@pytest.mark.parametrize("debug", [False, True])
def test_the_api_and_the_pages_answer_503_while_the_database_is_unreachable(
    unreachable, settings, debug
):
    settings.DEBUG = debug
    people = make_people()
    run = make_run()
    token = ApiToken.issue(people["operator"])
    page_client = Client(raise_request_exception=False)
    page_client.force_login(people["viewer"])
    api_client = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api_client.get("/api/runs").status_code == 200
    paths = api_client.get("/api/openapi.json").json()["paths"]
    documented = paths["/api/runs/{run_id}"]["get"]["responses"]["503"]

    unreachable()
    api = api_client.get(f"/api/runs/{run.pk}")
    page = page_client.get(f"/runs/{run.pk}/")

    assert api.status_code == 503
    assert api["Retry-After"] == "5"
    assert api.json() == {"detail": MESSAGE}
    # As the OpenAPI document says of every operation.
    assert documented["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
    assert set(documented["headers"]) == {"Retry-After"}
    assert page.status_code == 503
    assert page["Retry-After"] == "5"
    html = page.content.decode()
    assert MESSAGE in html and "Unavailable for a moment" in html
    assert "Traceback" not in html
