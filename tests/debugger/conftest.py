from __future__ import annotations

import pytest
from django.test import Client

from tests.base import PASSWORD, make_people


@pytest.fixture
def people(db):
    return make_people()


@pytest.fixture
def client_for(people):
    """client_for("operator") → a test client logged in as Olga (viewer Victor, admin Ada, outsider Oscar)."""

    def make(who: str | None) -> Client:
        client = Client()
        if who is not None:
            assert client.login(username=people[who].username, password=PASSWORD)
        return client

    return make


HX = {"HTTP_HX_REQUEST": "true"}


def hx(target: str) -> dict[str, str]:
    """Headers of an htmx request aimed at the element with this id."""
    return {**HX, "HTTP_HX_TARGET": target}


@pytest.fixture
def history(people):
    """Runs done, failed, approved and cancelled (with a formula as the reason), for the
    audit page."""
    from agentrun.lifecycle import services
    from tests.base import drive
    from tests.debugger import runs

    olga, ada = people["operator"], people["admin"]
    done = runs.walkthrough_run(olga)
    failed = runs.failing_run(ada)
    waiting = runs.waiting_run(olga)
    services.decide_approval(waiting, user=ada, decision="approve", comment="checked the invoice")
    drive(waiting)
    queued = runs.queued_run(olga)
    services.cancel_run(queued, user=olga, reason='=HYPERLINK("http://evil")')
    return {"done": done, "failed": failed, "waiting": waiting, "queued": queued}
