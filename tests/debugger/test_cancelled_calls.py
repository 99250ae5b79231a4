"""A cancelled call shows as cancelled, with its own style, on the run and audit pages."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from agentrun.models import ToolCallStatus
from tests.debugger import runs

pytestmark = pytest.mark.django_db


def test_cancelling_from_the_run_page_shows_the_pending_call_as_cancelled(client_for, people):
    run = runs.waiting_run(people["operator"])
    client = client_for("operator")

    page = client.post(f"/runs/{run.pk}/cancel/", {"reason": "duplicate"}, follow=True)

    html = page.content.decode()
    assert "Run cancelled" in html
    assert '<article class="call call-cancelled">' in html
    assert '<span class="badge cs-cancelled">cancelled</span>' in html
    assert 'cs-cancelled" title="write · cancelled"' in html  # the step list's chip
    # No call shows as awaiting (the search form's status choices still list the status).
    assert "cs-awaiting_approval" not in html and "awaiting approval</span>" not in html

    audit = client.get("/audit/").content.decode()
    assert '<span class="badge cs-cancelled">cancelled</span>' in audit


def test_every_tool_call_status_has_a_badge_style():
    css = (settings.BASE_DIR / "static" / "debugger" / "debugger.css").read_text()
    styled = set(re.findall(r"\.cs-([a-z_]+)\b", css))

    assert {s.value for s in ToolCallStatus} <= styled
