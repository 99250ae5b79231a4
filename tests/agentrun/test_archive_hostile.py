"""A hostile archive is refused by the one JSON policy, naming its line: lines nested far
too deep, a keyframe that would overflow the hashing, a forged archive (its digest made to
match) whose run input is nested 500 deep, numbers and labels no run may have. From the
module, the API (a 400, never a 500) and `manage.py importrun` (an error and a non-zero
exit, no traceback); nothing is stored."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import re
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agentrun.lifecycle import archive
from agentrun.models import ApiToken
from tests.agentrun import archives
from tests.agentrun.test_archive_export_import import forget
from tests.base import make_people
from tests.workers import ROOT, worker_env

pytestmark = pytest.mark.django_db

DEEP = "__DEEP__"


def nested(depth: int) -> str:
    """JSON text of a list nested `depth` deep (json.dumps would recurse)."""
    return "[" * depth + "]" * depth


def pack_lines(recs: list[dict], deep: str = "") -> bytes:
    """The records as an archive whose end line matches them (a forger's digest), with the
    string DEEP in them replaced by the raw JSON text `deep`."""
    lines = []
    for r in recs:
        if r["type"] == "end":
            continue
        text = json.dumps(r, ensure_ascii=False, separators=(",", ":"))
        lines.append(text.replace(json.dumps(DEEP), deep).encode() + b"\n")
    end = {
        "type": "end",
        "lines": len(lines),
        "sha256": hashlib.sha256(b"".join(lines)).hexdigest(),
    }
    return gzip.compress(b"".join(lines) + json.dumps(end).encode() + b"\n")


def line_of(recs: list[dict], record: dict) -> int:
    return recs.index(record) + 1


def first(recs, type_, **match):
    return next(
        r for r in recs if r["type"] == type_ and all(r.get(k) == v for k, v in match.items())
    )


@pytest.fixture
def exported():
    run = archives.finished_run()
    data = archives.export_bytes(run)
    forget(run)
    return archives.records(data)


def deep_line(depth: int):
    def make(recs):
        step = first(recs, "step", number=1)
        step["decision"]["thought"] = DEEP
        return pack_lines(recs, nested(depth)), f"line {line_of(recs, step)}", "nest"

    return make


def deep_keyframe(recs):
    snap = first(recs, "snapshot", kind="full")
    snap["data"]["memory"]["notes"] = {"deep": DEEP}
    return pack_lines(recs, nested(900)), f"line {line_of(recs, snap)}", "deeper than"


def deep_input(depth: int):
    def make(recs):
        run = first(recs, "run")
        run["input"]["goal"] = DEEP
        return pack_lines(recs, nested(depth)), f"line {line_of(recs, run)}", "input.goal"

    return make


def huge_number(recs):
    step = first(recs, "step", number=2)
    step["decision"]["thought"] = DEEP
    return pack_lines(recs, "1e999"), f"line {line_of(recs, step)}", "number out of range"


def long_integer(recs):
    step = first(recs, "step", number=2)
    step["decision"]["thought"] = DEEP
    return pack_lines(recs, "7" * 4000), f"line {line_of(recs, step)}", "integer too long"


def nul_text(recs):
    run = first(recs, "run")
    run["error"] = "before\x00after"
    return pack_lines(recs), f"line {line_of(recs, run)}", "NUL"


def labels(bad: dict, message: str):
    def make(recs):
        run = first(recs, "run")
        run["labels"] = bad
        return pack_lines(recs), f"line {line_of(recs, run)}", message

    return make


HOSTILE = {
    "a line nested 1,000 deep": deep_line(1_000),
    "a line nested 100,000 deep": deep_line(100_000),
    "a keyframe nested 900 deep": deep_keyframe,
    "a run input nested 500 deep, digest redone": deep_input(500),
    "a run input nested 70 deep": deep_input(70),
    "1e999": huge_number,
    "a 4,000-digit integer": long_integer,
    "a NUL": nul_text,
    "a label key with a space": labels({"bad key": "x"}, "label key 'bad key' is not allowed"),
    "a label value with a newline": labels({"team": "a\nb"}, "control character"),
    "an empty label value": labels({"team": ""}, "the value is empty"),
    "a NUL in a label": labels({"team": "a\x00b"}, "NUL"),
    "forked-from on a run that is no fork": labels(
        {"forked-from": "12345678"}, "'forked-from' is reserved"
    ),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_archive_is_refused_naming_its_line_and_stores_nothing(exported, name):
    data, line, message = HOSTILE[name](copy.deepcopy(exported))
    before = archives.row_counts()

    with pytest.raises(archive.ArchiveError) as info:
        archives.import_bytes(data)

    assert re.match(f"{line}\\b", str(info.value)), str(info.value)[:300]
    assert message in str(info.value)
    assert info.value.status == 400
    assert len(str(info.value)) < 1000  # it names the problem, it does not quote the line
    assert archives.row_counts() == before


@pytest.fixture
def operator_client():
    token = ApiToken.issue(make_people()["operator"])
    return Client(headers={"Authorization": f"Bearer {token}"}, raise_request_exception=False)


@pytest.mark.parametrize("name", HOSTILE)
def test_the_api_answers_400_naming_the_line(exported, operator_client, name):
    data, line, message = HOSTILE[name](copy.deepcopy(exported))
    before = archives.row_counts()

    response = operator_client.post("/api/runs/import", data=data, content_type="application/gzip")

    assert response.status_code == 400, response.content[:500]
    assert response.json()["detail"].startswith(f"{line}")
    assert message in response.json()["detail"]
    assert archives.row_counts() == before


@pytest.mark.parametrize("name", ["a line nested 100,000 deep", "a keyframe nested 900 deep"])
def test_the_command_fails_with_the_line(exported, tmp_path, name):
    data, line, message = HOSTILE[name](copy.deepcopy(exported))
    path = tmp_path / "hostile.agentrun.jsonl.gz"
    path.write_bytes(data)
    before = archives.row_counts()

    with pytest.raises(CommandError, match="nothing was imported") as info:
        call_command("importrun", str(path))

    assert f": {line}" in str(info.value) and message in str(info.value)
    assert archives.row_counts() == before


@pytest.mark.django_db(transaction=True)
def test_importrun_exits_non_zero_with_no_traceback(exported, tmp_path):
    data, line, message = HOSTILE["a line nested 100,000 deep"](copy.deepcopy(exported))
    path = tmp_path / "hostile.agentrun.jsonl.gz"
    path.write_bytes(data)
    before = archives.row_counts()

    result = subprocess.run(
        [sys.executable, "manage.py", "importrun", str(path)],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert f": {line}" in result.stderr and "nothing was imported" in result.stderr
    assert archives.row_counts() == before


def test_a_forks_own_forked_from_label_still_imports():
    parent = archives.finished_run()
    fork = archives.edited_fork(parent)
    data = archives.export_bytes(fork, ancestors=True)
    forget(parent, fork)

    runs = archives.import_bytes(data)

    assert [r.pk for r in runs] == [parent.pk, fork.pk]
    assert dict(runs[-1].labels.values_list("key", "value")) == {"forked-from": str(parent.pk)[:8]}
