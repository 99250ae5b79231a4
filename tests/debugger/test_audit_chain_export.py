"""The audit page's chain: its badge, and its export with the hashes, which a reviewer
verifies offline with the documentation's script."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache

from agentrun.audit import chain
from agentrun.models import ApiToken, Event
from tests.base import as_owner

pytestmark = pytest.mark.django_db
SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "verify_audit.py"


def verify_offline(tmp_path: Path, name: str, body: bytes) -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_bytes(body)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("form", ["csv", "jsonl"])
def test_the_export_verifies_offline_and_a_changed_record_is_named(
    client_for, history, tmp_path, form
):
    response = client_for("viewer").get(f"/audit/chain.{form}")
    assert response.status_code == 200
    assert "agentrun-audit-chain-" in response["Content-Disposition"]
    body = b"".join(response.streaming_content)

    done = verify_offline(tmp_path, f"all.{form}", body)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"verified: {Event.objects.count()} event(s)" in done.stdout

    cancelled = Event.objects.get(kind="run_cancelled")
    text = body.decode()
    assert text.count("HYPERLINK") == 1  # the cancel's reason, a formula in a spreadsheet
    changed = text.replace("HYPERLINK", "HYPERLYNX")
    broken = verify_offline(tmp_path, f"changed.{form}", changed.encode())
    assert broken.returncode == 1
    assert f"broken at event {cancelled.pk}:" in broken.stdout


def test_the_csv_neutralises_formulas_and_carries_the_hashes(client_for, history):
    body = b"".join(client_for("viewer").get("/audit/chain.csv").streaming_content).decode()
    rows = list(csv.DictReader(io.StringIO(body)))
    assert list(rows[0]) == [*chain.FIELDS, "hash"]
    cancelled = next(r for r in rows if r["kind"] == "run_cancelled")
    assert cancelled["reason"] == '\'=HYPERLINK("http://evil")'
    stored = Event.objects.get(kind="run_cancelled")
    assert (cancelled["hash"], cancelled["seq"]) == (stored.hash, str(stored.seq))


def test_the_export_follows_the_filters(client_for, history, people):
    client = client_for("viewer")
    olga = people["operator"].username

    def kinds(query: str) -> list[tuple[str, str]]:
        response = client.get(f"/audit/chain.jsonl?{query}")
        assert response.status_code == 200, query
        lines = b"".join(response.streaming_content).decode().splitlines()
        return [(r["actor"], r["kind"]) for r in map(json.loads, lines)]

    assert {a for a, _ in kinds(f"user={olga}")} == {olga}
    assert kinds("action=run_cancelled") == [(olga, "run_cancelled")]
    queued = history["queued"]
    assert {k for _, k in kinds(f"run={str(queued.pk)[:8]}")} >= {"run_created", "run_cancelled"}
    assert len(kinds("since=2000-01-01")) == Event.objects.count()
    assert kinds("until=2000-01-01") == []
    bad = client.get("/audit/chain.jsonl?run=not-a-run")
    assert bad.status_code == 400
    assert client.get("/audit/chain.xml").status_code == 404


def test_the_api_exports_with_the_same_filters(history, people, tmp_path):
    from django.test import Client

    api = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['viewer'])}")
    response = api.get("/api/audit/export", {"format": "csv", "action": "run_cancelled"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    body = b"".join(response.streaming_content)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert [r["kind"] for r in rows] == ["run_cancelled"]
    assert verify_offline(tmp_path, "one.csv", body).returncode == 0

    bad = api.get("/api/audit/export", {"since": "yesterday"})
    assert bad.status_code == 400
    assert "since" in bad.json()["detail"]
    assert api.get("/api/audit/export", {"format": "xml"}).status_code in (400, 422)
    # Offsets PostgreSQL refuses (beyond ±15:59), and a time before year 1 in UTC.
    odd = {"since": "0128-07-09T05:17:01Z", "until": "3639-03-16T18:48:47.6-16:38"}
    assert api.get("/api/audit/export", odd).status_code == 200
    assert api.get("/api/runs", odd).status_code == 200
    early = api.get("/api/audit/export", {"since": "0001-01-01T00:00:00+01:00"})
    assert early.status_code == 400 and "since" in early.json()["detail"]


def test_the_badge_says_verified_then_names_the_broken_event(client_for, history):
    cache.clear()
    client = client_for("viewer")
    page = client.get("/audit/").content.decode()
    assert 'hx-get="/audit/badge/"' in page
    assert "chains verified" in client.get("/audit/badge/").content.decode()

    target = Event.objects.get(kind="run_cancelled")
    as_owner("UPDATE agentrun_event SET reason = 'nothing to see' WHERE id = %s", [target.pk])
    # Within its minute the badge shows the verification it has; a new one names the event.
    assert "chains verified" in client.get("/audit/badge/").content.decode()
    cache.clear()
    badge = client.get("/audit/badge/").content.decode()
    assert f"chain broken at event {target.pk}" in badge
    assert "do not hash to its stored hash" in badge
