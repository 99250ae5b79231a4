"""A run exports to an archive and imports, read-only, with the same states and hashes."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from agentrun.lifecycle import archive
from agentrun.models import Event, Run, Snapshot, SnapshotKind, Step, ToolCall
from agentrun.store import snapshots
from agentrun.store.hashing import digest
from tests.agentrun import archives
from tests.base import drive, make_people

pytestmark = pytest.mark.django_db(transaction=True)


def forget(*runs: Run) -> None:
    """Remove runs (and their rows, events included) so their archive can come back."""
    ids = [r.pk for r in runs]
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the event log refuses DELETE otherwise
                cursor.execute("SET LOCAL session_replication_role = replica")
        Event.objects.filter(run_id__in=ids)._raw_delete(connection.alias)
        for run in reversed(runs):
            Run.objects.filter(pk=run.pk).update(forked_from=None)
        for run in reversed(runs):
            Run.objects.filter(pk=run.pk).delete()
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # within a test's transaction: triggers back on
                cursor.execute("SET LOCAL session_replication_role = origin")


def test_an_exported_run_imports_with_every_row_state_and_hash_as_it_was():
    olga = make_people()["operator"]
    run = archives.finished_run(olga)
    before = archives.hashes([run.pk])
    steps = list(Step.objects.filter(run=run).order_by("number").values())
    calls = list(
        ToolCall.objects.filter(run=run)
        .order_by("step__number", "index")
        .values(
            "index",
            "tool",
            "kind",
            "args",
            "idempotency_key",
            "status",
            "result",
            "attempts",
            "compensation",
            "created_at",
        )
    )
    events = list(
        Event.objects.filter(run_id=run.pk)
        .order_by("created_at", "id")
        .values("kind", "actor", "payload", "created_at", "step")
    )
    data = archives.export_bytes(run)
    forget(run)

    (imported,) = archives.import_bytes(data, user=olga)

    assert imported.pk == run.pk and imported.imported_at is not None
    assert imported.imported["archive_sha256"] and imported.imported["created_by"] == "olga"
    assert archives.hashes([run.pk]) == before
    assert all(stored == read for _, _, stored, read in before)
    assert [
        {k: v for k, v in s.items() if k != "id"}
        for s in Step.objects.filter(run=run).order_by("number").values()
    ] == [{k: v for k, v in s.items() if k != "id"} for s in steps]
    assert (
        list(
            ToolCall.objects.filter(run=run)
            .order_by("step__number", "index")
            .values(
                "index",
                "tool",
                "kind",
                "args",
                "idempotency_key",
                "status",
                "result",
                "attempts",
                "compensation",
                "created_at",
            )
        )
        == calls
    )
    got = list(
        Event.objects.filter(run_id=run.pk)
        .order_by("created_at", "id")
        .values("kind", "actor", "payload", "created_at", "step")
    )
    assert got[:-1] == events and got[-1]["kind"] == "run_imported"
    assert got[-1]["actor"] == "olga"


def test_the_archive_holds_a_manifest_each_record_and_a_digest_at_the_end():
    run = archives.finished_run()
    recs = archives.records(archives.export_bytes(run))
    manifest, end = recs[0], recs[-1]
    assert manifest["type"] == "manifest" and manifest["format_version"] == 1
    assert manifest["agent"] == "scripted" and manifest["agent_version"] == run.agent_version
    assert manifest["runs"][0]["steps"] == 4 and manifest["runs"][0]["snapshots"] == 8
    assert manifest["runs"][0]["last_hash"] == snapshots.get(run.pk, 4, "post").hash
    kinds = [r["type"] for r in recs[1:-1]]
    assert (
        kinds
        == ["run"]
        + ["snapshot"] * 8
        + ["step"] * 4
        + ["tool_call"] * 4
        + ["event"] * Event.objects.filter(run_id=run.pk).count()
    )
    assert end == {"type": "end", "lines": len(recs) - 1, "sha256": end["sha256"]}


def test_a_fork_without_its_parent_is_self_contained_and_keeps_its_lineage_as_ids():
    olga = make_people()["operator"]
    parent = archives.finished_run(olga)
    fork = archives.edited_fork(parent, olga)
    first = snapshots.get(fork.pk, 3, "pre")
    assert first.kind == SnapshotKind.FORK  # a reference into the parent
    before = archives.hashes([fork.pk])
    data = archives.export_bytes(fork)
    manifest = archives.records(data)[0]
    assert [n["id"] for n in manifest["lineage"]] == [str(parent.pk), str(fork.pk)]
    forget(fork)

    (imported,) = archives.import_bytes(data)

    assert imported.parent_id is None and imported.forked_from_id is None
    assert imported.imported["parent"] == str(parent.pk)
    assert imported.imported["forked_from"]["step"] == 3
    assert snapshots.get(fork.pk, 3, "pre").kind == SnapshotKind.FULL
    assert archives.hashes([fork.pk]) == before
    # Exported again from here, it still names its parent and its whole lineage.
    again = archives.records(archives.export_bytes(imported))
    assert again[0]["lineage"] == manifest["lineage"]
    assert (again[1]["parent"], again[1]["forked_from"]) == (
        str(parent.pk),
        manifest["runs"][0]["forked_from"],
    )


def test_with_its_ancestors_a_fork_keeps_its_link_to_its_parents_snapshot():
    olga = make_people()["operator"]
    parent = archives.finished_run(olga)
    fork = archives.edited_fork(parent, olga)
    before = archives.hashes([parent.pk, fork.pk])
    data = archives.export_bytes(fork, ancestors=True)
    forget(parent, fork)

    runs = archives.import_bytes(data)

    assert [r.pk for r in runs] == [parent.pk, fork.pk]
    fork = Run.objects.get(pk=fork.pk)
    assert fork.parent_id == parent.pk
    assert (fork.forked_from.run_id, fork.forked_from.step, fork.forked_from.at) == (
        parent.pk,
        3,
        "pre",
    )
    assert snapshots.get(fork.pk, 3, "pre").kind == SnapshotKind.FORK
    assert archives.hashes([parent.pk, fork.pk]) == before


def test_exportrun_and_importrun_commands(tmp_path):
    from django.core.management import call_command

    run = archives.finished_run()
    before = archives.hashes([run.pk])
    path = tmp_path / "run.gz"
    call_command("exportrun", str(run.pk), "-o", str(path))
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    forget(run)
    import io

    out = io.StringIO()
    call_command("importrun", str(path), stdout=out)
    assert out.getvalue().strip() == str(run.pk)
    assert archives.hashes([run.pk]) == before


def test_a_big_state_is_streamed_in_chunks_not_built_whole():
    run = archives.finished_run()
    chunks = list(archive.export_chunks(run))
    assert b"".join(chunks)[:2] == b"\x1f\x8b"
    lines = list(archive.export_lines(run))
    assert len(lines) == len(archives.records(b"".join(chunks)))
    assert digest(snapshots.load(run.pk, 1, "pre")) == Snapshot.objects.get(run=run, seq=2).hash


def test_labels_travel_with_the_run_and_retention_state_does_not():
    from agentrun.lifecycle import services
    from agentrun.models import RunLabel

    run = drive(
        services.start_run("scripted", archives.STEPS, labels={"ticket": "INC-7", "team": "pay"})
    )
    Run.objects.filter(pk=run.pk).update(pinned_at=run.created_at, pin_reason="incident")
    data = archives.export_bytes(Run.objects.get(pk=run.pk))
    record = archives.records(data)[1]
    assert record["labels"] == {"team": "pay", "ticket": "INC-7"}
    assert "pinned_at" not in record and "pin_reason" not in record
    forget(run)
    (imported,) = archives.import_bytes(data)
    assert dict(RunLabel.objects.filter(run=imported).values_list("key", "value")) == {
        "team": "pay",
        "ticket": "INC-7",
    }
    assert imported.pinned_at is None


def test_an_archives_index_of_paths_is_made_again_it_cannot_hide_a_change():
    """No hash covers Snapshot.paths: an archive that says its deltas and keyframes touched
    nothing still imports a run whose watch finds every change, with the index the run
    had (a delta's from its ops, a keyframe's from the state before it)."""
    from agentrun.store import watch

    run = archives.finished_run()
    path = watch.parse_path("iteration")
    before = [(c.step, c.at, c.before, c.after) for c in watch.history(run, path).changes]
    index = dict(Snapshot.objects.filter(run=run).values_list("seq", "paths"))
    recs = archives.records(archives.export_bytes(run))
    edited = [r for r in recs if r["type"] == "snapshot" and r["kind"] in ("delta", "full")]
    assert {r["kind"] for r in edited} == {"delta", "full"}
    assert any(r["kind"] == "full" and r["seq"] > 2 for r in edited), "a keyframe after the first"
    for r in edited:
        r["paths"] = "\n$/nothing\n"
    forget(run)
    (imported,) = archives.import_bytes(archives.pack(recs))
    after = [(c.step, c.at, c.before, c.after) for c in watch.history(imported, path).changes]
    assert after == before
    assert len(before) >= 3, before
    kept = Snapshot.objects.filter(run=imported, kind__in=[SnapshotKind.DELTA, SnapshotKind.FULL])
    assert dict(kept.values_list("seq", "paths")) == {r["seq"]: index[r["seq"]] for r in edited}
