"""A read call's result is stored once: packed against its step's post delta, which holds it
(the agent put it in its state). Every reader still gets the result itself."""

import gzip
import json
import zlib

import pytest
from django.db import connection

from agentrun.lifecycle import archive
from agentrun.models import Snapshot, SnapshotKind, ToolCall
from agentrun.store.codec import PACKED, json_text
from agentrun.store.search import matching_steps
from agentrun.tools import ToolContext, tool
from tests.base import calls, drive, final, make_run, script

pytestmark = pytest.mark.django_db


def prose(seed: int, words: int = 400) -> str:
    return " ".join(f"w{(i * 7919 + seed * 31) % 211}x{(i + seed) % 17}" for i in range(words))


@tool(kind="read", name="test_lookup")
def lookup(ctx: ToolContext, page: int) -> dict:
    """A read whose result is long prose, not its arguments."""
    return {"page": page, "text": prose(page), "found": f"marker-{page}-found"}


def run_of_lookups(pages: int = 4):
    steps = [calls({"tool": "test_lookup", "args": {"page": p}}) for p in range(1, pages + 1)]
    return drive(make_run(script(*steps, final())))


def stored(call: ToolCall) -> bytes:
    with connection.cursor() as cursor:
        cursor.execute("SELECT result FROM agentrun_toolcall WHERE id = %s", [call.pk])
        return bytes(cursor.fetchone()[0])


def packed_calls(run):
    """The run's read calls whose step's post snapshot is a delta (keyframes pack nothing)."""
    deltas = set(
        Snapshot.objects.filter(run=run, at="post", kind=SnapshotKind.DELTA).values_list(
            "step", flat=True
        )
    )
    return [
        c
        for c in ToolCall.objects.filter(run=run).select_related("step").order_by("step__number")
        if c.step.number in deltas
    ]


def test_a_read_result_is_stored_as_what_its_delta_lacks_and_read_back_whole():
    run = run_of_lookups()
    assert run.status == "succeeded"
    packed = packed_calls(run)
    assert packed, "some step's post snapshot is a delta"
    for call in packed:
        page = call.args["page"]
        expected = {"page": page, "text": prose(page), "found": f"marker-{page}-found"}
        blob = stored(call)
        assert blob[0] == PACKED
        assert len(blob) * 4 < len(zlib.compress(json_text(expected).encode()))
        assert call.result == expected
        by_values = ToolCall.objects.filter(pk=call.pk).values_list("result", flat=True)[0]
        assert by_values == expected


def test_the_search_finds_text_that_is_only_in_a_packed_result():
    run = run_of_lookups()
    call = packed_calls(run)[-1]
    assert stored(call)[0] == PACKED
    page = call.args["page"]
    assert matching_steps(run, q=f"MARKER-{page}-found") == {call.step.number}


def test_the_export_holds_each_result_whole_and_imports_back_equal():
    run = run_of_lookups()
    before = {c.index + 100 * c.step.number: c.result for c in packed_calls(run)}
    data = b"".join(archive.export_chunks(run))
    records = [json.loads(line) for line in gzip.decompress(data).splitlines()]
    results = {
        r["index"] + 100 * r["step"]: r["result"] for r in records if r["type"] == "tool_call"
    }
    assert {k: results[k] for k in before} == before
    # Imported here under the same id: the run must go first.
    ToolCall.objects.filter(run=run).delete()
    run.snapshots.all().delete()
    run.steps.all().delete()
    type(run).objects.filter(pk=run.pk).delete()
    (imported,) = archive.import_archive(lambda: _stream(data))
    again = {
        c.index + 100 * c.step.number: c.result
        for c in ToolCall.objects.filter(run=imported).select_related("step")
    }
    assert {k: again[k] for k in before} == before


def _stream(data: bytes):
    import io

    return io.BytesIO(data)


def test_a_call_with_side_effects_keeps_its_result_whole():
    run = drive(
        make_run(
            script(
                calls({"tool": "test_lookup", "args": {"page": 1}}),
                calls({"tool": "ledger_write", "args": {"account": "a1", "amount": 1}}),
                final(),
            )
        )
    )
    assert run.status == "succeeded"
    write = ToolCall.objects.get(run=run, tool="ledger_write")
    assert stored(write)[0] != PACKED
    assert zlib.decompress(stored(write))


def test_a_stale_remembered_dictionary_is_read_again_from_the_database():
    """A run deleted and imported again under its id may hold other text at the same
    snapshot: the stream's checksum tells, and the dictionary is read again."""
    from agentrun.store import codec

    run = run_of_lookups()
    call = packed_calls(run)[-1]
    expected = ToolCall.objects.get(pk=call.pk).result
    key = stored(call)[1:21]
    codec.remember_dictionary(run.pk, int.from_bytes(key[16:], "big"), b'["other text"]')
    assert ToolCall.objects.get(pk=call.pk).result == expected


def test_a_deltas_keyframe_is_its_dictionary_and_every_state_reads_back():
    from agentrun.store import codec, hashing, snapshots

    run = run_of_lookups(pages=6)
    codec.forget_dictionaries()  # as in another process: the keyframes are read from the database
    deltas = Snapshot.objects.filter(run=run, kind=SnapshotKind.DELTA)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT data FROM agentrun_snapshot WHERE run_id = %s AND kind = 'delta'",
            [run.pk.hex if connection.vendor == "sqlite" else run.pk],
        )
        marks = {bytes(row[0])[:1] for row in cursor.fetchall()}
    assert b"\x01" in marks  # packed against a keyframe's text
    for snap in deltas:
        state = snapshots.load_state(snap)
        assert snap.hash == hashing.build(state).hex


def test_search_finds_no_result_whose_dictionary_a_purge_took_meanwhile_and_does_not_fail():
    from agentrun.store import codec
    from agentrun.store.search import stored_calls

    run = run_of_lookups()
    packed = packed_calls(run)
    assert packed
    codec.forget_dictionaries()
    # What a purge leaves for a moment: the calls read, their post deltas already gone.
    Snapshot.objects.filter(run=run, at="post", kind=SnapshotKind.DELTA).delete()
    rows = {step_id: result for step_id, _, result in stored_calls(run.pk)}
    assert all(rows[call.step_id] is None for call in packed)


def test_a_hash_written_as_hex_text_by_older_code_reads_back_as_it_is():
    field = ToolCall._meta.get_field("args_hash")
    assert field.from_db_value("ab" * 32, None, connection) == "ab" * 32
    assert field.from_db_value(bytes.fromhex("ab" * 32), None, connection) == "ab" * 32


def test_a_runs_results_are_read_with_their_deltas_in_one_pass(monkeypatch):
    """inflate_results (the search's reader): every result as inflate() reads it alone,
    in a fixed number of queries whatever the number of steps and keyframes."""
    from django.db import connection as conn
    from django.test.utils import CaptureQueriesContext

    from agentrun.store import codec, snapshots

    monkeypatch.setattr(snapshots, "KEYFRAME_ROWS", 4)  # keyframes every few steps
    run = run_of_lookups(pages=20)
    keyframes = Snapshot.objects.filter(run=run, kind=SnapshotKind.FULL).count()
    assert keyframes >= 2  # the first state's, and at least one the deltas cross
    calls_ = ToolCall.objects.filter(run=run).order_by("step__number")
    blobs = [stored(call) for call in calls_]
    assert sum(blob[:1] == bytes([PACKED]) for blob in blobs) >= 8
    codec.forget_dictionaries()
    snapshots.forget_keyframe_texts()
    with CaptureQueriesContext(conn) as queries:
        texts = snapshots.inflate_results(run.pk, blobs)
    assert len(queries) <= 2  # the first delta's keyframe_seq, then the chain
    codec.forget_dictionaries()
    assert texts == [codec.inflate(blob) for blob in blobs]
    assert [json.loads(t) for t in texts] == [call.result for call in calls_]


def test_a_result_whose_delta_is_gone_reads_as_none_without_a_query_each():
    """What a purge leaves for a moment (the calls, their deltas gone): the search's reader
    passes over those results in the one pass, not with a query per result."""
    from django.db import connection as conn
    from django.test.utils import CaptureQueriesContext

    from agentrun.store import codec, snapshots

    run = run_of_lookups(pages=8)
    calls_ = list(ToolCall.objects.filter(run=run).order_by("step__number"))
    blobs = [stored(call) for call in calls_]
    packed = [i for i, blob in enumerate(blobs) if blob[:1] == bytes([PACKED])]
    assert len(packed) >= 4
    codec.forget_dictionaries()
    snapshots.forget_keyframe_texts()
    Snapshot.objects.filter(run=run, at="post", kind=SnapshotKind.DELTA).delete()
    with CaptureQueriesContext(conn) as queries:
        texts = snapshots.inflate_results(run.pk, blobs, gone_as_none=True)
    assert len(queries) <= 2
    assert all(texts[i] is None for i in packed)
    kept = [i for i in range(len(blobs)) if i not in packed]
    assert all(json.loads(texts[i]) == calls_[i].result for i in kept)
    with pytest.raises(ValueError):
        snapshots.inflate_results(run.pk, blobs)
