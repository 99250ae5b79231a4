"""What the audit trail's hash chain costs per commit that appends an event.

Run by hand, not by pytest, on a database of its own (it writes to the event log and
changes its triggers):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_audit_bench \\
        .venv/bin/python bench/bench_audit_chain.py [--commits 500] [--rounds 5]
    AGENTRUN_VAR_DIR=/tmp/ar-audit-bench .venv/bin/python bench/bench_audit_chain.py  # SQLite

Times two kinds of commit, each in its own transaction:

- `system`: an UPDATE of a run row and one system event of that run (what an engine
  commit that records a wait or a failure does), through the engine's raw SQL;
- `operator`: an operator's action through `record_event` (on PostgreSQL the actor is
  handed to the database in the transaction).

Each with the chain (the trigger, the head row's lock, the unique (stream, seq) index)
and without it (trigger off, index dropped: the log as it was before migration 0020),
alternating in rounds so the machine's noise falls on both. On PostgreSQL also `insert`:
one event's INSERT as the server times it (EXPLAIN ANALYZE), the trigger's work alone. Prints the median ms per
commit of each and the ratio. `--no-flush` measures PostgreSQL's commits without waiting
for the disk: the chain's own work, which the flush otherwise hides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/ar-audit-bench")
os.environ["AGENTRUN_ENQUEUE"] = "false"
os.environ.setdefault("LOG_LEVEL", "WARNING")


UNIQUE = 'CREATE UNIQUE INDEX event_stream_seq ON agentrun_event ("stream", "seq") WHERE "seq" > 0'


def chain_off() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_chain")
            cursor.execute("DROP INDEX event_stream_seq")
        else:
            cursor.execute("DROP TRIGGER agentrun_event_chain")
            cursor.execute("DROP INDEX event_stream_seq")


def chain_on() -> None:
    from django.db import connection, transaction

    migration = import_module("agentrun.migrations.0021_audit_chain")
    with transaction.atomic(), connection.cursor() as cursor:
        # The unchained events of the last round go (the bench's own database).
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("DELETE FROM agentrun_event WHERE stream = ''")
            cursor.execute("SET LOCAL session_replication_role = origin")
            cursor.execute(UNIQUE)
            cursor.execute("ALTER TABLE agentrun_event ENABLE TRIGGER agentrun_event_chain")
        else:
            cursor.execute("DELETE FROM agentrun_event WHERE stream = ''")
            cursor.execute(UNIQUE)
            cursor.execute(migration.SQLITE_FORWARD)


def system_commits(run, n: int) -> float:
    from django.db import transaction
    from django.utils import timezone

    from agentrun.models import Event, Run
    from agentrun.store import rawsql

    started = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(updated_at=timezone.now())
            rawsql.db().cursor().execute(
                f"INSERT INTO {rawsql.table(Event)} (run_id, step, kind, actor, reason, payload,"
                " created_at) VALUES (%s, %s, 'retry_scheduled', 'system', '', %s, %s)",
                [
                    rawsql.prep(Event, "run_id", run.pk),
                    i,
                    rawsql.prep(Event, "payload", {"attempt": i, "error": "timeout"}),
                    rawsql.prep(Event, "created_at", timezone.now()),
                ],
            )
    return (time.perf_counter() - started) * 1000 / n


def operator_commits(run, user, n: int) -> float:
    from agentrun.audit.events import record_event

    started = time.perf_counter()
    for i in range(n):
        record_event("note", run=run, user=user, reason="checked", payload={"n": i})
    return (time.perf_counter() - started) * 1000 / n


def insert_ms(run, n: int) -> float:
    """PostgreSQL: the median execution time of one event's INSERT (EXPLAIN ANALYZE, the
    trigger included), each in its own transaction: the chain's work without the round
    trips and the flush, steadier than a commit's time on a busy machine."""
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(n):
            cursor.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO agentrun_event (run_id, step, kind,"
                " actor, reason, payload, created_at) VALUES (%s, 1, 'retry_scheduled', 'system',"
                " '', '{\"attempt\": 1}', now())",
                [run.pk],
            )
            (plan,) = cursor.fetchone()
            plan = json.loads(plan) if isinstance(plan, str) else plan
            times.append(plan[0]["Execution Time"])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--no-flush",
        action="store_true",
        help="PostgreSQL: commits don't wait for the WAL flush (the chain's CPU, without the disk)",
    )
    args = parser.parse_args()

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from agentrun.audit import chain
    from agentrun.lifecycle import services

    call_command("migrate", verbosity=0)
    if args.no_flush and connection.vendor == "postgresql":
        connection.cursor().execute("SET synchronous_commit = off")
    user, _ = get_user_model().objects.get_or_create(username="bench-operator")
    run = services.start_run("scripted", {"goal": "bench", "steps": [{"final": "done"}]})
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for chained in (False, True):
            if not chained:
                chain_off()
            system = system_commits(run, args.commits)
            operator = operator_commits(run, user, args.commits)
            if connection.vendor == "postgresql":
                times.setdefault(("insert", chained), []).append(insert_ms(run, args.commits))
            if not chained:
                chain_on()
            times.setdefault(("system", chained), []).append(system)
            times.setdefault(("operator", chained), []).append(operator)
    assert chain.verify().ok
    flush = " (no WAL flush)" if args.no_flush and connection.vendor == "postgresql" else ""
    print(f"{connection.vendor}{flush}: {args.rounds} rounds of {args.commits} commits each")
    for kind in ("system", "operator", "insert"):
        if (kind, False) not in times:
            continue
        off = statistics.median(times[(kind, False)])
        on = statistics.median(times[(kind, True)])
        print(f"  {kind:9} without chain {off:.3f} ms/commit, with {on:.3f}: x{on / off:.2f}")


if __name__ == "__main__":
    main()
