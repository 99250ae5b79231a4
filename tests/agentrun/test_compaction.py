"""A finished run's deltas regrouped (agentrun.store.compaction): everything reads back the same."""

from __future__ import annotations

import zlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import BinaryField, ExpressionWrapper, F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentrun import engine
from agentrun.lifecycle import services
from agentrun.models import Run, Snapshot, ToolCall
from agentrun.store import codec, compaction, snapshots, watch
from agentrun.store.codec import GROUP, SLICE
from tests.base import calls, drive, final, make_run, script

pytestmark = pytest.mark.django_db

RAW = ExpressionWrapper(F("data"), output_field=BinaryField())
STEPS = 150


@pytest.fixture(autouse=True)
def _long_enough(settings):
    settings.AGENTRUN_COMPACT_STEPS = 20


def long_run(steps: int = STEPS) -> Run:
    """A scripted run of `steps` echo calls (reads: their results are packed against
    their step's delta), then an answer, run to the end in this process."""
    words = [
        "the",
        "cart",
        "holds",
        "a",
        "stove",
        "and",
        "a",
        "tent",
        "for",
        "the",
        "weekend",
        "camping",
        "trip",
    ]
    run = make_run(
        script(
            *[
                calls({"tool": "echo", "args": {"n": i, "note": " ".join(words[i % 7 :])}})
                for i in range(steps)
            ],
            final("all echoed"),
        )
    )
    engine.execute_step(run.pk, 1, chain=600)
    run.refresh_from_db()
    assert run.status == "succeeded"
    return run


def stored(run: Run) -> dict[int, tuple[str, bytes]]:
    rows = Snapshot.objects.filter(run=run).exclude(kind="ref").values_list("seq", "kind", RAW)
    return {seq: (kind, bytes(data)) for seq, kind, data in rows}


def as_another_process() -> None:
    codec.forget_groups()
    codec.forget_dictionaries()
    snapshots.forget_keyframe_texts()


def everything(run: Run) -> dict:
    """What readers see: every snapshot's state (replayed, and each loaded on its own),
    the raw chain's texts, every call's result, and a few paths' histories."""
    last = Snapshot.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True)[0]
    history = [(s.step, s.at, state) for s, state in snapshots.history(run.pk)]
    return {
        "history": history,
        "loaded": [snapshots.load(run.pk, step, at) for step, at, _ in history[::7]],
        "chain": list(snapshots.chain_texts(run.pk, 0, last, refs=True)),
        "results": list(ToolCall.objects.filter(run=run).order_by("pk").values_list("result")),
        "watched": [
            [
                (c.step, c.at, c.kind, c.before, c.after)
                for c in watch.history(run, watch.parse_path(path)).changes
            ]
            for path in ("history[-1].content", "/iteration", "tool_calls[3]", "memory")
        ],
    }


def test_a_regrouped_run_reads_back_every_snapshot_result_and_history_as_before():
    run = long_run()
    before, raw = everything(run), stored(run)
    assert sum(1 for kind, _ in raw.values() if kind == "full") >= 2, "no keyframe to cut at"

    regrouped = compaction.compact(run.pk)
    as_another_process()

    after = stored(run)
    marks = [data[:1] for kind, data in after.values() if kind == "delta"]
    assert regrouped == marks.count(GROUP) + marks.count(SLICE) > STEPS * 0.9
    assert marks.count(GROUP) < regrouped / 10
    for seq, (kind, data) in raw.items():  # keyframes as they were
        if kind != "delta":
            assert after[seq] == (kind, data)
    delta_bytes = [sum(len(d) for k, d in rows.values() if k == "delta") for rows in (raw, after)]
    assert delta_bytes[1] < delta_bytes[0]
    assert everything(run) == before
    assert compaction.compact(run.pk) == 0  # nothing left to regroup


def test_a_fork_of_a_regrouped_run_starts_from_the_state_it_was_forked_at(people):
    run = long_run(60)
    compaction.compact(run.pk)
    as_another_process()
    state = snapshots.load(run.pk, 30, "post")
    fork = services.fork_run(run, step=31, at="pre", user=people["operator"])
    as_another_process()
    assert snapshots.load(fork.pk, 31, "pre") == state
    drive(fork, max_steps=200)
    fork.refresh_from_db()
    assert fork.status == "succeeded"


def test_a_member_whose_group_is_gone_or_another_one_says_so():
    run = long_run(60)
    compaction.compact(run.pk)
    rows = stored(run)
    holder_seq = next(seq for seq, (k, d) in sorted(rows.items()) if d[:1] == GROUP)
    member_seq = next(
        seq for seq, (k, d) in sorted(rows.items()) if d[:1] == SLICE and seq > holder_seq
    )
    member = rows[member_seq][1]
    assert int.from_bytes(member[17:21], "big") == holder_seq
    # Another group under the holder's locator (a run imported again, regrouped again).
    (other,) = codec.group_values(run.pk, holder_seq, [b'[["set",["x"],1]]'], 6)
    Snapshot.objects.filter(run=run, seq=holder_seq).update(data=other)
    as_another_process()
    with pytest.raises(zlib.error, match="doesn't match the group"):
        codec.inflate(member)
    Snapshot.objects.filter(run=run, seq=holder_seq).delete()
    as_another_process()
    with pytest.raises(ValueError, match="which is gone"):
        codec.inflate(member)


def test_only_ended_unpurged_runs_long_enough_are_regrouped(settings):
    short = long_run(10)
    assert compaction.compact(short.pk) == 0
    run = long_run(40)
    Run.objects.filter(pk=run.pk).update(status="running")
    assert compaction.compact(run.pk) == 0
    Run.objects.filter(pk=run.pk).update(status="succeeded", purged_at=timezone.now())
    assert compaction.compact(run.pk) == 0
    Run.objects.filter(pk=run.pk).update(purged_at=None)
    settings.AGENTRUN_COMPACT_STEPS = 0
    assert compaction.compact(run.pk) == 0
    settings.AGENTRUN_COMPACT_STEPS = 20
    assert compaction.compact(run.pk) > 30
    assert not any(d[:1] in (GROUP, SLICE) for _, d in stored(short).values())


def test_the_run_that_ends_asks_for_it_and_so_does_a_cancel(monkeypatch, settings):
    sent = []
    monkeypatch.setattr(compaction, "send", sent.append)
    run = long_run(25)
    assert sent == [run.pk]
    sent.clear()
    long_run(10)  # shorter than AGENTRUN_COMPACT_STEPS
    assert sent == []
    settings.AGENTRUN_COMPACT_STEPS = 1
    cancelled = make_run(script(calls({"tool": "echo", "args": {}}), final()))
    engine.execute_step(cancelled.pk, 1)
    services.cancel_run(cancelled)
    assert sent == [cancelled.pk]


def test_the_command_regroups_the_runs_named_or_all():
    first, second = long_run(30), long_run(30)
    out = StringIO()
    call_command("compact", str(first.pk), stdout=out)
    assert f"{first.pk}: " in out.getvalue() and "deltas regrouped" in out.getvalue()
    assert any(d[:1] == SLICE for _, d in stored(first).values())
    assert not any(d[:1] == SLICE for _, d in stored(second).values())
    out = StringIO()
    call_command("compact", "--all", stdout=out)
    assert f"{first.pk}: 0 deltas" in out.getvalue()
    assert any(d[:1] == SLICE for _, d in stored(second).values())
    with pytest.raises(CommandError, match="give run ids"):
        call_command("compact")


def test_a_regrouped_run_exports_the_records_it_exported_before():
    from tests.agentrun import archives

    run = long_run(60)

    def exported() -> list[dict]:
        recs = archives.records(archives.export_bytes(run))
        for rec in recs:  # the time of export, and the digest of the lines that hold it
            rec.pop("exported_at", None)
            if rec["type"] == "end":
                rec.pop("sha256")
        return recs

    before = exported()
    assert compaction.compact(run.pk) > 50
    as_another_process()
    assert exported() == before


@pytest.mark.django_db(transaction=True)
def test_a_reader_meanwhile_reads_every_state_as_before():
    """Another thread replays the run's whole history again and again while the run is
    regrouped, one group a transaction: each replay is the same as before."""
    import threading

    from django.db import connection

    run = long_run(150)
    before = [state for _, state in snapshots.history(run.pk)]
    seen, failures, stop = [], [], threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set() or len(seen) < 2:
                codec.forget_groups()
                seen.append([state for _, state in snapshots.history(run.pk)] == before)
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert compaction.compact(run.pk, group_size=8) > 140
    finally:
        stop.set()
        thread.join(60)
    assert not failures and seen and all(seen)
    assert [state for _, state in snapshots.history(run.pk)] == before


def test_groups_bigger_than_the_cache_are_written_and_read_as_before(monkeypatch):
    """The check before a write reads the new values alone: a group the process's cache
    can't hold (or another thread evicted) is still written, and read back right."""
    run = long_run(60)
    before = everything(run)
    monkeypatch.setattr(codec, "_GROUPS_MAX_BYTES", 64)
    assert compaction.compact(run.pk) > 50
    as_another_process()
    assert everything(run) == before
    assert not codec._GROUPS  # none of them was kept


def test_a_group_holds_at_most_group_max_bytes_of_text(monkeypatch):
    run = long_run(60)
    before = everything(run)
    sizes = dict(Snapshot.objects.filter(run=run, kind="delta").values_list("seq", "stored_bytes"))
    cap = 3 * max(sizes.values())
    monkeypatch.setattr(compaction, "GROUP_MAX_BYTES", cap)
    assert compaction.compact(run.pk) > 40
    groups: dict[bytes, int] = {}
    for seq, (_, data) in sorted(stored(run).items()):
        if data[:1] in (GROUP, SLICE):
            groups[data[1:21]] = groups.get(data[1:21], 0) + sizes[seq]
    assert len(groups) > 10 and max(groups.values()) <= cap
    as_another_process()
    assert everything(run) == before


def test_members_of_many_groups_are_read_with_their_holders_in_one_query(monkeypatch):
    """A value that a few steps changed meets a new group at nearly every one of them:
    the holders come in one query, not one each, and the history is the one before."""
    run = long_run(90)
    texts = {seq: codec.inflate(d) for seq, (k, d) in stored(run).items() if k == "delta"}
    monkeypatch.setattr(watch, "_DENSE_MIN", 10**6)  # every read of this history sparse
    path = watch.parse_path("/iteration")
    changes = [(c.step, c.at, c.before, c.after) for c in watch.history(run, path).changes]
    assert compaction.compact(run.pk, group_size=4) > 80
    members = {seq: d for seq, (_, d) in stored(run).items() if d[:1] == SLICE}
    picked = sorted(members)[::4]
    assert len({members[seq][1:21] for seq in picked}) == len(picked) > 15

    as_another_process()
    with CaptureQueriesContext(connection) as queries:
        assert codec.inflate_many([members[seq] for seq in picked]) == [
            texts[seq] for seq in picked
        ]
    assert len(queries) == 1
    as_another_process()
    with CaptureQueriesContext(connection) as queries:
        after = [(c.step, c.at, c.before, c.after) for c in watch.history(run, path).changes]
    assert after == changes
    groups = len({d[1:21] for d in members.values()})
    assert len(queries) < groups / 4, [q["sql"][:80] for q in queries.captured_queries]
