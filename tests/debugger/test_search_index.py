"""A long finished run's text search goes to its stored index (agentrun.store.callsearch): it
finds what a scan of the calls finds without reading them, is used only while it matches
the run's calls, is built by a worker when the run ends, and goes with the purge."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from agentrun.lifecycle import retention
from agentrun.models import Run, SearchBlock, ToolCall
from agentrun.store import callsearch, search
from agentrun.store.search import matching_steps
from tests.base import calls, drive, final, make_run, script
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db

NEEDLES = (
    "VALUE-33",
    "value-4",
    '"found":"value-5"',
    '"found": "value-5"',  # stored compactly: no match
    "ITEM-12",  # arguments
    '"amount":',  # the ledger writes' arguments
    "ärger IM café",
    "été",
    "no such text",
    # Text that spans two calls, or a call's arguments and result, is in neither.
    'value-1"}{"item',
    'item-1"}{"found',
    f'value-1"}}{callsearch.CALL_SEP}{{"item',
    f'item-1"}}{callsearch.PART_SEP}{{"found',
)


@pytest.fixture
def small_blocks(settings, monkeypatch):
    """Runs of 10 steps and more get an index, in blocks of a few calls each."""
    settings.AGENTRUN_SEARCH_INDEX_STEPS = 10
    monkeypatch.setattr(callsearch, "BLOCK_CHARS", 300)
    search.forget_call_texts()
    yield
    search.forget_call_texts()


@pytest.fixture
def sent(monkeypatch):
    """The runs a worker was asked to index."""
    asked: list = []
    monkeypatch.setattr(callsearch, "send", asked.append)
    callsearch._REQUESTED.clear()
    return asked


def unread(monkeypatch) -> None:
    """From here on, reading the run's calls fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the calls were read")

    monkeypatch.setattr(search, "stored_calls", refuse)


def sample_run(user) -> Run:
    run = long_run(user, 60)
    ToolCall.objects.filter(run=run, step__number=3).update(result={"found": "Ärger im Café"})
    ToolCall.objects.filter(run=run, step__number=2).update(args={"item": "ÉTÉ"})
    return run


def test_the_index_finds_what_a_scan_finds_without_reading_the_calls(
    people, small_blocks, sent, monkeypatch
):
    run = sample_run(people["operator"])
    scanned = {needle: matching_steps(run, q=needle) for needle in NEEDLES}
    assert scanned["VALUE-33"] == {33} and scanned["value-4"] == {4, *range(40, 50)}
    assert scanned["ärger IM café"] == {3} and scanned["ITEM-12"] == {12}
    assert scanned['"amount":'] == set(range(10, 60, 10))
    assert sent == [run.pk]  # the scan asked for the index, once
    search.forget_call_texts()

    blocks = callsearch.build(run.pk)

    assert blocks == SearchBlock.objects.filter(run=run).count() > 5
    unread(monkeypatch)
    assert {needle: matching_steps(run, q=needle) for needle in NEEDLES} == scanned
    # With the other criteria too: the text only among the steps they leave.
    assert matching_steps(run, q="value-5", tool="ledger_write") == {50}
    assert matching_steps(run, q="VALUE-33", status="failed") == set()
    assert sent == [run.pk]


def test_a_result_written_after_the_index_was_built_is_found(people, small_blocks, sent):
    """A side effect still running when its run was cancelled writes its result late."""
    run = long_run(people["operator"], 30, status="cancelled")
    ToolCall.objects.filter(run=run, step__number=20, kind="write").update(
        status="running", result=None
    )
    assert callsearch.build(run.pk) > 0
    assert matching_steps(run, q='"ok":20') == set()

    ToolCall.objects.filter(run=run, step__number=20, kind="write").update(
        status="ok", result={"ok": 20, "late": True}
    )

    assert not callsearch.has_index(run)
    assert matching_steps(run, q='"late":true') == {20}
    assert sent == [run.pk]  # asked for again, for the calls as they are now


def test_an_index_of_calls_since_deleted_is_not_used_then_rebuilt(
    people, small_blocks, sent, monkeypatch
):
    run = long_run(people["operator"], 30)
    callsearch.build(run.pk)
    ToolCall.objects.filter(run=run, step__number=8).delete()

    assert matching_steps(run, q="value-8") == set()
    search.forget_call_texts()
    callsearch.build(run.pk)
    unread(monkeypatch)
    assert matching_steps(run, q="value-8") == set()
    assert matching_steps(run, q="value-9") == {9}


def test_a_build_whose_run_changed_while_it_read_writes_nothing(people, small_blocks, monkeypatch):
    run = long_run(people["operator"], 30)
    callsearch.build(run.pk)
    real = callsearch.stored_calls

    def racing(run_id, *args):
        rows = real(run_id, *args)
        ToolCall.objects.filter(run=run, step__number=3).delete()  # meanwhile
        return rows

    monkeypatch.setattr(callsearch, "stored_calls", racing)

    assert callsearch.build(run.pk) == 0
    assert not SearchBlock.objects.filter(run=run).exists()  # the old one went too
    monkeypatch.setattr(callsearch, "stored_calls", real)
    assert matching_steps(run, q="value-3") == set()


def test_of_two_builds_at_once_the_one_that_ends_first_stands_whole(
    people, small_blocks, monkeypatch
):
    run = sample_run(people["operator"])
    scanned = {needle: matching_steps(run, q=needle) for needle in NEEDLES}
    search.forget_call_texts()
    monkeypatch.setattr(callsearch, "BUILD_STEPS", 10)
    real = callsearch.stored_calls
    reads: list[int] = []
    other: list[int] = []

    def interleaved(run_id, *args):
        reads.append(1)
        if len(reads) == 3:  # this build has written blocks: another one runs whole
            other.append(callsearch.build(run_id))
        return real(run_id, *args)

    monkeypatch.setattr(callsearch, "stored_calls", interleaved)

    assert callsearch.build(run.pk) == 0
    assert other[0] == SearchBlock.objects.filter(run=run).count() > 5
    assert callsearch.has_index(run)
    unread(monkeypatch)
    assert {needle: matching_steps(run, q=needle) for needle in NEEDLES} == scanned


def test_a_long_run_without_calls_has_an_empty_index(people, small_blocks, sent, monkeypatch):
    run = long_run(people["operator"], 12)
    ToolCall.objects.filter(run=run).delete()

    assert callsearch.build(run.pk) == 1
    assert callsearch.has_index(run)
    unread(monkeypatch)
    assert matching_steps(run, q="value-3") == set()
    assert sent == []


def test_short_active_and_purged_runs_get_no_index(people, small_blocks, sent):
    short = long_run(people["operator"], 9)
    live = long_run(people["operator"], 40, status="running")
    gone = long_run(people["operator"], 40)
    callsearch.build(gone.pk)
    assert SearchBlock.objects.filter(run=gone).exists()
    Run.objects.filter(pk=gone.pk).update(purged_at=gone.finished_at)

    assert [callsearch.build(r.pk) for r in (short, live, gone)] == [0, 0, 0]

    assert not SearchBlock.objects.exists()
    for run in (short, live):
        assert matching_steps(run, q="value-5") == {5}
    assert sent == []


def test_a_long_run_that_ends_asks_a_worker_for_its_index(people, settings, sent):
    reads = script(*[calls({"tool": "echo", "args": {"n": i}}) for i in range(4)], final())
    settings.AGENTRUN_SEARCH_INDEX_STEPS = 5
    long = drive(make_run(reads, user=people["operator"]))
    settings.AGENTRUN_SEARCH_INDEX_STEPS = 6
    short = drive(make_run(reads, user=people["operator"]))

    assert (long.status, short.status) == ("succeeded", "succeeded")
    assert sent == [long.pk]


def test_the_purge_deletes_the_index_with_the_results(people, small_blocks, sent):
    run = long_run(people["operator"], 40)
    blocks = callsearch.build(run.pk)
    assert blocks > 1
    Run.objects.filter(pk=run.pk).update(finished_at=run.finished_at - timedelta(days=60))

    report = retention.purge(timedelta(days=30))

    assert (report.runs, report.search_blocks) == (1, blocks)
    assert report.as_dict()["search_blocks"] == blocks
    assert not SearchBlock.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert matching_steps(run, q="value-5") == set()


def test_the_command_builds_the_missing_indexes_of_long_finished_runs(people, small_blocks):
    long = long_run(people["operator"], 30)
    short = long_run(people["operator"], 5)
    live = long_run(people["operator"], 30, status="running")
    out = io.StringIO()

    call_command("search_index", "--missing", stdout=out)

    assert {r for r in SearchBlock.objects.values_list("run_id", flat=True)} == {long.pk}
    assert f"{long.pk}: " in out.getvalue() and str(short.pk) not in out.getvalue()
    ToolCall.objects.filter(run=long, step__number=4).delete()  # now stale
    again = io.StringIO()
    call_command("search_index", "--missing", stdout=again)
    assert f"{long.pk}: " in again.getvalue() and callsearch.has_index(long)
    call_command("search_index", str(live.pk)[:8], stdout=out)
    assert not SearchBlock.objects.filter(run=live).exists()
    with pytest.raises(CommandError, match="run ids, or --missing"):
        call_command("search_index")
    with pytest.raises(CommandError):
        call_command("search_index", "no-such-run")
