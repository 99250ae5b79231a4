"""Export and import of a 1,000-step run whose state grows to 2.5 MB. Run by hand, not by pytest:

    AGENTRUN_VAR_DIR=/tmp/ar-export-bench .venv/bin/python bench/bench_export.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_export_bench .venv/bin/python bench/bench_export.py

Give it a database of its own: it migrates it and empties the run tables. It plays the
shared workload (bench/agent.py, variant grow, N = 1000) through the engine in this
process, then measures the run's stored bytes (PostgreSQL: the run tables' total relation
sizes after VACUUM FULL; SQLite: the pages of the run tables, from dbstat), the export to a
file (`archive.export_chunks`, as `manage.py exportrun` and the API stream it) and the
import of that file (`archive.import_archive`: the checking pass, then the writing one),
after the run is removed. Checks that every snapshot hash is the same after the import.
Targets: export ≤ 2 s, import ≤ 5 s, archive ≤ 2 × the run's stored bytes.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/ar-export-bench")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ["AGENTRUN_FAULTS"] = "false"
os.environ["AGENTRUN_AGENT_MODULES"] = "bench.agent"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from agentrun import engine  # noqa: E402
from agentrun.lifecycle import archive, services  # noqa: E402
from agentrun.models import Event, Run, Snapshot  # noqa: E402

N = 1000
EXPORTS = 3
TABLES = (
    "agentrun_run",
    "agentrun_step",
    "agentrun_snapshot",
    "agentrun_toolcall",
    "agentrun_event",
)


def empty() -> None:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the event log refuses DELETE otherwise
                cursor.execute("SET LOCAL session_replication_role = replica")
        Event.objects.all()._raw_delete(connection.alias)
        Run.objects.update(forked_from=None)
        Run.objects.all().delete()


def play() -> Run:
    run = services.start_run("workload", {"variant": "grow", "n": N})
    while True:
        run.refresh_from_db()
        if run.status not in ("queued", "running"):
            break
        engine.execute_step(run.pk, run.next_step, chain=24 * 3600.0)
    assert run.status == "succeeded", run.error
    return run


def stored_bytes() -> int:
    """The bytes the run takes in its database (it is the only run there)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for table in TABLES:
                cursor.execute(f"VACUUM FULL {table}")  # the live rows only
            cursor.execute(
                "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c",
                [list(TABLES)],
            )
            return int(cursor.fetchone()[0])
        cursor.execute("VACUUM")
        try:
            cursor.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN (SELECT name FROM sqlite_master "
                f"WHERE tbl_name IN ({','.join('%s' for _ in TABLES)}))",
                list(TABLES),
            )
            return int(cursor.fetchone()[0])
        except Exception:  # SQLite built without dbstat: the whole file, a slight overcount
            return Path(connection.settings_dict["NAME"]).stat().st_size


def hashes(run_id: object) -> list[tuple[int, str]]:
    return list(Snapshot.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "hash"))


def main() -> None:
    call_command("migrate", verbosity=0)
    # A run left by an earlier pass (imported, the same rows) is measured again as it is.
    run = Run.objects.filter(agent="workload", status="succeeded").first()
    played = 0.0
    if run is None or Run.objects.count() != 1:
        empty()
        t = time.perf_counter()
        run = play()
        played = time.perf_counter() - t
    state_mb = Snapshot.objects.get(run=run, seq=Snapshot.seq_for(N, "post")).size / 1e6
    stored = stored_bytes()
    before = hashes(run.pk)
    path = Path(os.environ["AGENTRUN_VAR_DIR"]) / "bench-export.agentrun.jsonl.gz"
    exports = []
    for _ in range(EXPORTS):
        exports.append(_time(lambda: _export(run, path)))
    size = path.stat().st_size
    empty()
    checked = _time(lambda: _check(path))  # the first pass alone, for the breakdown
    imported = _time(lambda: archive.import_archive(partial(open, path, "rb")))
    assert hashes(run.pk) == before, "hashes changed"
    db = connection.vendor
    print(f"database: {db}; run: {N} steps, {len(before)} snapshots, state {state_mb:.2f} MB")
    print(f"played in {played:.1f} s (0: an earlier pass's run); stored {stored:,} B")
    print(
        f"export: {statistics.median(exports):.2f} s median of {EXPORTS} "
        f"({', '.join(f'{e:.2f}' for e in exports)}) · target ≤ 2 s"
    )
    print(f"archive: {size:,} B = {size / stored:.2f} × stored · target ≤ 2 ×")
    print(
        f"import: {imported:.2f} s (of which the checking pass alone: {checked:.2f} s) · target ≤ 5 s"
    )
    print("hashes after import: identical")
    cpu = ", ".join(f"{c:.2f}" for c in CPU)
    print(f"CPU seconds of this process (exports, check, import): {cpu}")


def _export(run: Run, path: Path) -> None:
    with open(path, "wb") as out:
        for chunk in archive.export_chunks(run):
            out.write(chunk)


def _check(path: Path) -> None:
    # The checking pass on its own refuses a run that exists: look at it before the import.
    with open(path, "rb") as f:
        archive.check(f)


def _time(fn: object) -> float:
    """Wall time; the CPU time of this process goes to CPU (the machine is shared)."""
    t, c = time.perf_counter(), time.process_time()
    fn()  # type: ignore[operator]
    CPU.append(time.process_time() - c)
    return time.perf_counter() - t


CPU: list[float] = []


if __name__ == "__main__":
    main()
