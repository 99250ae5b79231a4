"""The benchmark's own environment: database, broker, settings, and table sizes.

Everything runs against a dedicated PostgreSQL database (ar_bench) and Redis db 7,
never the dev or test ones. `setup()` must run before anything imports Django models.
"""

from __future__ import annotations

import os
import sys
from typing import Any
from urllib.parse import urlparse

from bench.wl import ROOT

DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ar_bench")
BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/7")
OUT = ROOT / "bench" / "out"

# What a run writes: the figures are per case over these tables.
PROJECT_TABLES = (
    "agentrun_run",
    "agentrun_step",
    "agentrun_snapshot",
    "agentrun_toolcall",
    "agentrun_event",
)
FLOOR_TABLE = "bench_floor"
# One row per step: the step's delta and nothing else (no index, no key).
FLOOR_DDL = f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (run int NOT NULL, step int NOT NULL, delta jsonb NOT NULL)"


def environment() -> dict[str, str]:
    """The settings environment of the bench process and of its workers."""
    return {
        "DJANGO_SETTINGS_MODULE": "agentrun.settings",
        "DATABASE_URL": DATABASE_URL,
        "CELERY_BROKER_URL": BROKER_URL,
        "AGENTRUN_AGENT_MODULES": "bench.agent",
        "AGENTRUN_FAULTS": "0",
        "AGENTRUN_VAR_DIR": str(OUT / "var"),
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }


def setup() -> None:
    """Point this process at the bench database and broker, create and migrate the database."""
    os.environ.update(environment())
    os.environ["AGENTRUN_ENQUEUE"] = "0"  # the in-process cases drive the engine themselves
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    _create_database()

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    with raw(autocommit=True) as conn:
        conn.execute(FLOOR_DDL)


def _create_database() -> None:
    import psycopg

    name = urlparse(DATABASE_URL).path.lstrip("/")
    admin = urlparse(DATABASE_URL)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def raw(autocommit: bool = False, url: str = "") -> Any:
    """A plain psycopg connection to the bench database, or `url`'s (not Django's)."""
    import psycopg

    return psycopg.connect(url or DATABASE_URL, autocommit=autocommit)


def server_settings() -> dict[str, str]:
    with raw(autocommit=True) as conn:
        out = {"version": conn.execute("SHOW server_version").fetchone()[0]}
        for name in (
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_sync_method",
            "shared_buffers",
            "default_toast_compression",
        ):
            out[name] = conn.execute(f"SHOW {name}").fetchone()[0]
    return out


def truncate() -> None:
    """Empty the project's tables and the floor's (new files: sizes start from zero)."""
    from django.db import connection

    connection.close()  # drop Django's connection so nothing holds a lock or a cached plan
    with raw() as conn:
        # The event log refuses TRUNCATE (a trigger): a superuser skips triggers, as a replica.
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            f"TRUNCATE {', '.join(PROJECT_TABLES)}, {FLOOR_TABLE} RESTART IDENTITY CASCADE"
        )
        conn.commit()


def table_sizes(tables: tuple[str, ...], url: str = "") -> dict[str, dict[str, int]]:
    """After VACUUM ANALYZE: total (heap + TOAST + indexes), table (heap + TOAST), indexes."""
    with raw(autocommit=True, url=url) as conn:
        for t in tables:
            conn.execute(f"VACUUM ANALYZE {t}")
        rows = conn.execute(
            "SELECT relname, pg_total_relation_size(oid), pg_table_size(oid), pg_indexes_size(oid) "
            "FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'",
            (list(tables),),
        ).fetchall()
    return {
        name: {"total": total, "table": table, "indexes": idx} for name, total, table, idx in rows
    }
