"""Export in one configuration, import in the other and back (embedded SQLite ⇄
PostgreSQL, real databases both sides): the same hashes and the same diff pages.

The test's own database is one side; tests/agentrun/archive_side.py runs the others
as separate processes, each on a fresh database of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from django.test import Client

from agentrun.models import Step
from tests.agentrun import archives
from tests.base import PASSWORD, make_people

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
PG_SERVER = "postgres://postgres@127.0.0.1:5432"
HX_PANE = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "snap-pane"}


def diff_pages(run_ids: list[str]) -> dict[str, str]:
    """Each step's diff of the runs, and the diff between the first and the last run's
    last snapshots, as the debugger renders them (the pane htmx swaps in)."""
    client = Client(SERVER_NAME="localhost")
    assert client.login(username="victor", password=PASSWORD)
    urls = [
        f"/runs/{run_id}/steps/{n}/diff/"
        for run_id in run_ids
        for n in Step.objects.filter(run_id=run_id)
        .order_by("number")
        .values_list("number", flat=True)
    ]
    urls.append(f"/diff/?a={run_ids[0]}:4:post&b={run_ids[-1]}:4:post")
    pages = {}
    for url in urls:
        response = client.get(url, **HX_PANE)
        assert response.status_code == 200, url
        pages[url] = response.content.decode()
    return pages


def far_side(database_url: str, archive: Path, tmp: Path, export_to: Path | None) -> dict:
    report = tmp / f"report-{uuid.uuid4().hex[:6]}.json"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "AGENTRUN_VAR_DIR": str(tmp / "var"),
        "AGENTRUN_ENQUEUE": "0",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("CELERY_BROKER_URL", None)
    args = [sys.executable, "-m", "tests.agentrun.archive_side", str(archive), str(report)]
    if export_to:
        args.append(str(export_to))
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.fixture
def fresh_databases(tmp_path):
    """fresh("postgresql"|"sqlite") -> the DATABASE_URL of a new, empty database."""
    made: list[str] = []

    def fresh(vendor: str) -> str:
        if vendor == "sqlite":
            return f"sqlite:///{tmp_path / f'side-{uuid.uuid4().hex[:6]}.sqlite3'}"
        name = f"h_export_side_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return f"{PG_SERVER}/{name}"

    yield fresh
    for name in made:
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_fork_and_its_parent_go_to_the_other_database_and_back_unchanged(
    tmp_path, fresh_databases
):
    here = connection.vendor
    other = "sqlite" if here == "postgresql" else "postgresql"
    people = make_people()
    parent = archives.finished_run(people["operator"])
    fork = archives.edited_fork(parent, people["operator"])
    ids = [str(parent.pk), str(fork.pk)]
    truth = {"hashes": archives.hashes(ids), "pages": diff_pages(ids)}
    assert all(stored == read for _, _, stored, read in truth["hashes"])
    assert any("edited goal" in page for page in truth["pages"].values())
    first = tmp_path / "here.gz"
    first.write_bytes(archives.export_bytes(fork, ancestors=True))

    there = far_side(fresh_databases(other), first, tmp_path, export_to=tmp_path / "there.gz")
    back = far_side(fresh_databases(here), tmp_path / "there.gz", tmp_path, export_to=None)

    for side in (there, back):
        assert side["run"] == str(fork.pk) and side["runs"] == ids and side["imported"]
        assert [tuple(h) for h in side["hashes"]] == truth["hashes"]
        assert side["pages"].keys() == truth["pages"].keys()
        for url, page in truth["pages"].items():
            assert side["pages"][url] == page, url

    # The archive made over there holds the same records, but for the import event it
    # adds. Compared as JSON values: PostgreSQL's jsonb columns (a run's input, a step's
    # decision) keep no key order.
    def comparable(path: Path) -> list[dict]:
        recs = archives.records(path.read_bytes())[1:-1]
        return [r for r in recs if r.get("kind") != "run_imported"]

    assert comparable(tmp_path / "there.gz") == comparable(first)
