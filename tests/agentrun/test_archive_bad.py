"""A bad archive gets a clear error and stores nothing: from the API (never a 500), the
command (an exit code) and the module."""

from __future__ import annotations

import copy
import gzip
import io
import tracemalloc

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agentrun.lifecycle import archive
from agentrun.models import ApiToken
from tests.agentrun import archives
from tests.agentrun.test_archive_export_import import forget
from tests.base import make_people

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported():
    """A finished run's archive and its records, the run itself no longer here."""
    run = archives.finished_run()
    data = archives.export_bytes(run)
    forget(run)
    return data, archives.records(data)


def first(recs, type_, **match):
    return next(
        r for r in recs if r["type"] == type_ and all(r.get(k) == v for k, v in match.items())
    )


def tampered_hash(recs):
    snap = first(recs, "snapshot", seq=5)
    snap["hash"] = "0" * 64
    return archives.pack(recs)


def tampered_state(recs, reseal):
    snap = first(recs, "snapshot", kind="full")
    snap["data"]["memory"]["goal"] = "not what happened"
    return archives.pack(recs, reseal=reseal)


def unknown_version(recs):
    recs[0]["format_version"] = 2
    return archives.pack(recs)


def step_dropped(recs):
    recs.remove(first(recs, "step", number=4))
    return archives.pack(recs)


def bad_delta(recs):
    snap = first(recs, "snapshot", kind="delta")
    snap["data"] = [["set", ["no", "such", "path"], 1]]
    return archives.pack(recs)


def wrong_type(recs):
    first(recs, "step", number=1)["number"] = "1"
    return archives.pack(recs)


def not_hex(recs):
    first(recs, "tool_call")["args_hash"] = "not a digest"
    return archives.pack(recs)


def too_long(recs):
    first(recs, "tool_call")["tool"] = "t" * 500
    return archives.pack(recs)


def call_twice(recs):
    """Passes every check pass one makes; the database's unique key (a step's call
    index) refuses it in pass two."""
    call = first(recs, "tool_call")
    recs.insert(recs.index(call), copy.deepcopy(call))
    recs[0]["runs"][0]["tool_calls"] += 1
    return archives.pack(recs)


def truncated_lines(recs):
    """Whole lines, a valid gzip stream, but the end line is missing."""
    lines = [archive._line(r) for r in recs[:-3]]
    return gzip.compress(b"".join(lines))


BAD = {
    "truncated gzip": (lambda data, recs: data[: len(data) // 2], 400, "truncated"),
    "missing end line": (lambda data, recs: truncated_lines(recs), 400, "end line is missing"),
    "tampered hash": (lambda data, recs: tampered_hash(recs), 400, "doesn't match its hash"),
    "tampered state, digest kept": (
        lambda data, recs: tampered_state(recs, reseal=False),
        400,
        "changed or damaged",
    ),
    "tampered state, digest redone": (
        lambda data, recs: tampered_state(recs, reseal=True),
        400,
        "doesn't match its hash",
    ),
    "unknown version": (
        lambda data, recs: unknown_version(recs),
        400,
        "unknown archive format version 2",
    ),
    "a step missing": (lambda data, recs: step_dropped(recs), 400, "incomplete"),
    "a delta that doesn't apply": (lambda data, recs: bad_delta(recs), 400, "delta"),
    "a wrong type": (lambda data, recs: wrong_type(recs), 400, "wrong type"),
    "a name too long": (lambda data, recs: too_long(recs), 400, "longer than 100"),
    "a hash that is no hex": (
        lambda data, recs: not_hex(recs),
        400,
        "args_hash has the wrong type",
    ),
    "a duplicate call": (lambda data, recs: call_twice(recs), 400, "can't be stored here"),
    "not gzip": (lambda data, recs: b'{"type": "manifest"}\n', 400, "not gzip"),
    "empty": (lambda data, recs: b"", 400, "empty"),
    "bytes after the stream": (lambda data, recs: data + b"junk", 400, "after its gzip"),
    "not JSON": (lambda data, recs: gzip.compress(b"{nope\n"), 400, "not JSON"),
    "not an archive": (
        lambda data, recs: gzip.compress(b'{"type": "run"}\n'),
        400,
        "first line is no agentrun manifest",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_a_bad_archive_is_refused_by_the_module_and_stores_nothing(exported, name):
    data, recs = exported
    make, _, message = BAD[name]
    bad = make(data, copy.deepcopy(recs))
    before = archives.row_counts()
    with pytest.raises(archive.ArchiveError, match=message):
        archives.import_bytes(bad)
    assert archives.row_counts() == before


@pytest.fixture
def operator_client():
    token = ApiToken.issue(make_people()["operator"])
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client, data, content_type="application/gzip"):
    return client.post("/api/runs/import", data=data, content_type=content_type)


@pytest.mark.parametrize("name", BAD)
def test_a_bad_archive_is_a_clear_4xx_from_the_api_and_stores_nothing(
    exported, operator_client, name
):
    data, recs = exported
    make, status, message = BAD[name]
    before = archives.row_counts()
    response = post(operator_client, make(data, copy.deepcopy(recs)))
    assert response.status_code == status, response.content
    assert message in response.json()["detail"]
    assert archives.row_counts() == before


def test_a_run_that_exists_already_is_a_409_and_nothing_changes(operator_client):
    run = archives.finished_run()
    data = archives.export_bytes(run)
    before = archives.row_counts()
    response = post(operator_client, data)
    assert response.status_code == 409
    assert f"run {run.pk} already exists" in response.json()["detail"]
    assert archives.row_counts() == before


def test_the_command_fails_with_the_reason_and_stores_nothing(exported, tmp_path):
    data, recs = exported
    path = tmp_path / "bad.gz"
    path.write_bytes(tampered_hash(copy.deepcopy(recs)))
    before = archives.row_counts()
    with pytest.raises(CommandError, match="doesn't match its hash.*nothing was imported"):
        call_command("importrun", str(path))
    with pytest.raises(CommandError, match="can't read"):
        call_command("importrun", str(tmp_path / "missing.gz"))
    assert archives.row_counts() == before


class Counting(io.BytesIO):
    def __init__(self, data):
        super().__init__(data)
        self.served = 0

    def read(self, n=-1):
        chunk = super().read(n)
        self.served += len(chunk)
        return chunk


def test_the_size_limit_is_checked_while_reading_not_after(settings):
    big = gzip.compress(b"x" * (4 * archive.CHUNK), 0)  # stored, not compressed
    settings.AGENTRUN_IMPORT_MAX_BYTES = archive.CHUNK
    stream = Counting(big)
    with pytest.raises(archive.ArchiveError, match="larger than the limit") as err:
        archive.check(stream)
    assert err.value.status == 413
    assert stream.served <= 2 * archive.CHUNK < len(big)  # the rest is never read


def test_an_upload_over_the_limit_is_a_413_before_it_is_read(exported, operator_client, settings):
    data, _ = exported
    settings.AGENTRUN_IMPORT_MAX_BYTES = len(data) - 1
    before = archives.row_counts()
    response = post(operator_client, data)
    assert response.status_code == 413
    assert "larger than the limit" in response.json()["detail"]
    assert archives.row_counts() == before


@pytest.mark.parametrize(
    "payload, limit, message",
    [
        (b"{}\n" * (32 * 1024 * 1024), "AGENTRUN_IMPORT_MAX_EXPANDED_BYTES", "gzip bomb"),
        (b"x" * (64 * 1024 * 1024), "AGENTRUN_IMPORT_MAX_LINE_BYTES", "longer than"),
    ],
    ids=["many lines", "one endless line"],
)
def test_a_gzip_bomb_is_stopped_at_the_limit_without_inflating_it(
    settings, payload, limit, message
):
    bomb = gzip.compress(payload, 9)
    assert len(bomb) < 300_000  # 64 MiB in a few hundred KB
    setattr(settings, limit, 4 * 1024 * 1024)
    tracemalloc.start()
    inflated = 0
    try:
        with pytest.raises(archive.ArchiveError, match=message) as err:
            for _, line in archive.read_lines(io.BytesIO(bomb)):
                inflated += len(line) + 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.status == 413
    assert inflated <= 4 * 1024 * 1024
    assert peak < 16 * 1024 * 1024  # never the 64 MiB it inflates to


def test_a_gzip_bomb_uploaded_is_a_413_and_stores_nothing(operator_client, settings):
    settings.AGENTRUN_IMPORT_MAX_LINE_BYTES = 4 * 1024 * 1024
    before = archives.row_counts()
    response = post(operator_client, gzip.compress(b"x" * (64 * 1024 * 1024), 9))
    assert response.status_code == 413
    assert "longer than 4 MiB" in response.json()["detail"]
    assert archives.row_counts() == before


def test_a_body_that_is_not_an_archive_says_how_to_send_one(operator_client):
    response = post(operator_client, b'{"run": 1}', content_type="application/json")
    assert response.status_code == 400
    assert "Content-Type application/gzip" in response.json()["detail"]


def test_an_archive_that_changes_between_the_two_passes_stores_nothing(exported):
    data, recs = exported
    other = copy.deepcopy(recs)
    first(other, "step", number=1)["number"] = 99  # its tool calls' step is gone now
    reads = iter([data, archives.pack(other)])
    before = archives.row_counts()
    with pytest.raises(archive.ArchiveError, match="changed while it was being imported"):
        archive.import_archive(lambda: io.BytesIO(next(reads)))
    assert archives.row_counts() == before
