"""The audit page: operator actions and side-effecting calls across runs, filters, CSV."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.models import Event, ToolCall
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


def test_it_lists_operator_actions_and_write_and_hybrid_calls(client_for, history):
    response = client_for("viewer").get("/audit/")
    actions = list(response.context["actions"])
    assert {e.kind for e in actions} == {"run_created", "approved", "run_cancelled"}
    assert all(e.user_id for e in actions)
    calls = list(response.context["calls"])
    assert {c.kind for c in calls} == {"write", "hybrid"}
    assert {c.tool for c in calls} == {"reserve", "ledger_write", "notify"}
    html = response.content.decode()
    assert "checked the invoice" in html
    compensated = ToolCall.objects.get(run=history["failed"], tool="reserve")
    assert compensated.idempotency_key in html and "cs-compensated" in html


def test_it_filters_by_user_tool_kind_run_and_date(client_for, history):
    client = client_for("viewer")

    def kinds(query):
        r = client.get(f"/audit/?{query}")
        return sorted(e.kind for e in r.context["actions"]), sorted(
            c.tool for c in r.context["calls"]
        )

    actions, calls = kinds("user=ada")
    assert actions == ["approved", "run_created"]
    assert calls == ["ledger_write", "reserve"]  # ada's failed run and the call she approved
    assert kinds("tool=reserve")[1] == ["reserve", "reserve"]
    assert kinds("kind=write")[1] == ["ledger_write", "ledger_write", "notify"]
    assert kinds("kind=write")[0] == ["approved"]
    actions, calls = kinds(f"run={history['waiting'].pk}")
    assert actions == ["approved", "run_created"] and calls == ["ledger_write"]
    tomorrow = (timezone.now() + timedelta(days=1)).date().isoformat()
    assert kinds(f"since={tomorrow}") == ([], [])
    assert kinds(f"run={str(history['waiting'].pk)[:8]}") == (actions, calls)  # a short id
    response = client.get("/audit/?run=not-a-uuid")
    assert b"is not a valid run id" in response.content


def test_the_csv_export_has_every_record_and_neutralises_formulas(client_for, history):
    response = client_for("viewer").get("/audit/export.csv")
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="agentrun-audit-')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert (
        len(rows)
        == Event.objects.filter(user__isnull=False).count()
        + ToolCall.objects.filter(kind__in=("write", "hybrid")).count()
    )
    stamps = [r["at"] for r in rows]
    assert stamps == sorted(stamps, reverse=True)
    cancel = next(r for r in rows if r["action"] == "run_cancelled")
    assert cancel["actor"] == "olga" and cancel["reason"].startswith("'=HYPERLINK")
    approved = next(
        r
        for r in rows
        if r["record"] == "tool_call"
        and r["tool"] == "ledger_write"
        and r["run"] == str(history["waiting"].pk)
    )
    assert approved["actor"] == "ada" and approved["status"] == "ok"
    assert approved["idempotency_key"].startswith(f"{history['waiting'].pk}:2:0:ledger_write:")
    reserve = next(
        r for r in rows if r["tool"] == "reserve" and r["run"] == str(history["failed"].pk)
    )
    assert reserve["status"] == "compensated" and reserve["compensation"] == "ok"


def test_the_csv_export_follows_the_filters(client_for, history):
    response = client_for("viewer").get("/audit/export.csv?tool=notify")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert {r["tool"] for r in rows} == {"notify"}


def test_htmx_gets_one_section(client_for, history):
    client = client_for("viewer")
    body = client.get("/audit/", **hx("audit-calls")).content.decode()
    assert body.lstrip().startswith('<section id="audit-calls"') and "audit-actions" not in body
    body = client.get("/audit/", **hx("audit-actions")).content.decode()
    assert body.lstrip().startswith('<section id="audit-actions"')
