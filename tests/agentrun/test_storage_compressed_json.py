"""Snapshot data and tool results are stored compressed and read back exactly as written."""

import json
import math
import zlib

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings

from agentrun.models import Run, Snapshot, Step, ToolCall
from agentrun.store import codec
from tests.agentrun.test_delta import json_values

pytestmark = pytest.mark.django_db

ODD = [
    1e16,
    -0.0,
    0.0,
    5e-324,
    1.7976931348623157e308,
    0.1 + 0.2,
    2**70,
    -(2**63),
    True,
    1,
    1.0,
    "",
    "\x00 nul",
    "héllo wörld ✓ 𝄞 🦀",
    "\ud800 lone high",
    "lone low \udfff",
    "\u2028\u2029",
    {"b": 1, "a": 2, "": None, "𝄞": [1.5, -0.0]},
]


def exact(value):
    """JSON text that tells apart key order, 1 / 1.0 / True, -0.0 / 0.0 and escapes."""
    return json.dumps(value)


def snapshot_with(run, data, seq=0):
    return Snapshot.objects.create(
        run=run,
        step=seq // 2,
        at="pre",
        seq=seq,
        kind="full",
        data=data,
        keyframe_seq=seq,
        hash="0" * 64,
        size=0,
    )


def tool_call_with(run, result, n=1):
    step = Step.objects.create(run=run, number=n)
    return ToolCall.objects.create(
        run=run,
        step=step,
        index=0,
        tool="echo",
        kind="read",
        args={},
        args_hash="0" * 64,
        idempotency_key=f"{run.pk}:{n}",
        status="ok",
        result=result,
    )


@pytest.fixture
def run():
    return Run.objects.create(agent="scripted")


@pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
def test_odd_numbers_and_strings_round_trip_exactly_in_a_snapshot_and_a_tool_result(run, value):
    data = {"v": value, "in_a_list": [value, {"k": value}]}
    snap = snapshot_with(run, data)
    call = tool_call_with(run, value)
    assert exact(Snapshot.objects.get(pk=snap.pk).data) == exact(data)
    assert exact(ToolCall.objects.get(pk=call.pk).result) == exact(value)


def test_a_lone_surrogate_comes_back_as_the_same_code_point(run):
    snap = snapshot_with(run, {"s": "a\ud83db"})
    assert Snapshot.objects.get(pk=snap.pk).data["s"] == "a\ud83db"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=json_values)
def test_any_json_value_round_trips_exactly(run, value):
    n = Snapshot.objects.filter(run=run).count()
    snap = snapshot_with(run, value, seq=n)
    call = tool_call_with(run, value, n=n + 1)
    assert exact(Snapshot.objects.get(pk=snap.pk).data) == exact(value)
    assert exact(ToolCall.objects.get(pk=call.pk).result) == exact(value)
    assert exact(ToolCall.objects.filter(pk=call.pk).values_list("result", flat=True)[0]) == (
        exact(value)
    )


def test_none_is_sql_null_and_can_be_filtered_on(run):
    snap = snapshot_with(run, None)
    call = tool_call_with(run, None)
    assert Snapshot.objects.get(pk=snap.pk).data is None
    assert ToolCall.objects.filter(pk=call.pk, result__isnull=True).exists()
    with connection.cursor() as cur:
        cur.execute("SELECT data FROM agentrun_snapshot WHERE id = %s", [snap.pk])
        assert cur.fetchone()[0] is None


def test_the_column_holds_zlib_compressed_compact_json_much_smaller_than_the_text(run):
    prose = " ".join(["the quick brown fox jumps over the lazy dog"] * 100)
    data = {"messages": [{"role": "tool", "content": prose}], "n": 1}
    snap = snapshot_with(run, data)
    with connection.cursor() as cur:
        cur.execute("SELECT data FROM agentrun_snapshot WHERE id = %s", [snap.pk])
        stored = bytes(cur.fetchone()[0])
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    assert zlib.decompress(stored) == text
    assert len(stored) < len(text) / 10


def test_a_row_inserted_with_raw_sql_through_the_field_reads_back_through_the_model(run):
    """The engine's raw-SQL inserts convert values with the field's get_db_prep_value."""
    field = ToolCall._meta.get_field("result")
    step = Step.objects.create(run=run, number=1)
    value = {"z": [1e16, -0.0, "\ud800"], "a": "ünïcode"}
    with connection.cursor() as cur:
        cur.execute(
            'INSERT INTO agentrun_toolcall (run_id, step_id, "index", tool, kind, args,'
            " args_hash, idempotency_key, status, result, error, attempts,"
            " requires_approval, from_cache, created_at)"
            " VALUES (%s, %s, 0, 'echo', 'read', %s, %s, 'k', 'ok', %s, '', %s, %s, %s, %s)",
            [
                ToolCall._meta.get_field("run").get_db_prep_value(run.pk, connection),
                step.pk,
                ToolCall._meta.get_field("args").get_db_prep_value({}, connection),
                ToolCall._meta.get_field("args_hash").get_db_prep_value("0" * 64, connection),
                field.get_db_prep_value(value, connection),
                ToolCall._meta.get_field("attempts").get_db_prep_value([], connection),
                False,
                False,
                ToolCall._meta.get_field("created_at").get_db_prep_value(
                    run.created_at, connection
                ),
            ],
        )
    assert exact(ToolCall.objects.get(idempotency_key="k").result) == exact(value)


def test_nan_is_refused_rather_than_stored_as_something_else(run):
    with pytest.raises(ValueError):
        snapshot_with(run, {"x": math.nan})


def test_a_damaged_value_is_refused_with_zlibs_own_error_whichever_inflater_reads_it():
    """codec.inflate reads plain values with ISA-L when it is installed (the project
    depends on it); a damaged or cut value still raises zlib.error, which callers catch."""
    text = json.dumps({"notes": ["the quick brown fox"] * 50}).encode()
    stored = zlib.compress(text)
    assert codec._isal_zlib is not None, "isal is a dependency: it should be installed"
    assert codec.inflate(stored) == text
    bad_window = b"\xf8\x9b" + stored[2:]  # a header zlib refuses: a 64 KiB window and more
    for damaged in (
        stored[: len(stored) // 2],
        stored[:10] + b"\x00" * 20 + stored[30:],
        bad_window,
        b"",
    ):
        with pytest.raises(zlib.error):
            codec.inflate(damaged)
