"""Where a run's stored bytes go: per table, per index, per column, per snapshot kind.

    .venv/bin/python bench/bytes_audit.py --variant grow --n 1000

Runs one workload run through the in-process engine on the bench database (as
bench/run.py does: tables truncated first, VACUUM ANALYZE after), then prints, per
step: each table's heap, TOAST and index bytes, each index's bytes, each column's
bytes (sum of pg_column_size over the live rows), the tuple headers and line
pointers, and what the heap holds beyond the live rows (free space left by updates).
The column sums are exact and repeatable; the heap's free space depends on when
pages were pruned, so the totals move by a few per cent between runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import env  # noqa: E402

TUPLE_OVERHEAD = 24 + 4  # heap tuple header (with its null bitmap, for these tables) + line pointer


def _columns(conn, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def audit(n: int) -> dict:
    out: dict = {}
    with env.raw(autocommit=True) as conn:
        for table in env.PROJECT_TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
            rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            heap, toast, total = conn.execute(
                "SELECT pg_relation_size(c.oid), coalesce(pg_total_relation_size(c.reltoastrelid), 0),"
                " pg_total_relation_size(c.oid) FROM pg_class c WHERE c.relname = %s",
                (table,),
            ).fetchone()
            indexes = conn.execute(
                "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
                "WHERE t.relname = %s ORDER BY 1",
                (table,),
            ).fetchall()
            cols = _columns(conn, table)
            sums = conn.execute(
                "SELECT "
                + ", ".join(f'coalesce(sum(pg_column_size("{c}")), 0)' for c in cols)
                + f" FROM {table}"
            ).fetchone()
            out[table] = {
                "rows": rows,
                "heap": heap,
                "toast": toast,
                "total": total,
                "indexes": dict(indexes),
                "columns": dict(zip(cols, (int(s) for s in sums), strict=True)),
            }
        kinds = conn.execute(
            "SELECT kind, count(*), sum(coalesce(pg_column_size(data), 0)) "
            "FROM agentrun_snapshot GROUP BY kind ORDER BY kind"
        ).fetchall()
        out["snapshot_kinds"] = kinds
    return out


def show(out: dict, n: int) -> None:
    grand = 0
    for table in env.PROJECT_TABLES:
        t = out[table]
        grand += t["total"]
        live = sum(t["columns"].values()) + t["rows"] * TUPLE_OVERHEAD
        print(
            f"\n{table}: {t['total'] / n:,.0f} B/step total, {t['rows']} rows "
            f"({t['rows'] / n:.2f}/step); heap {t['heap'] / n:,.0f}, toast {t['toast'] / n:,.0f}, "
            f"indexes {sum(t['indexes'].values()) / n:,.0f}"
        )
        print(
            f"  live tuples ≈ {live / n:,.0f} B/step (columns + {TUPLE_OVERHEAD} B/row header "
            f"and line pointer); heap beyond that {(t['heap'] - live) / n:,.0f} B/step"
        )
        for name, size in sorted(t["indexes"].items(), key=lambda x: -x[1]):
            print(f"  index {name:40s} {size / n:8,.1f}")
        for name, size in sorted(t["columns"].items(), key=lambda x: -x[1]):
            if size:
                print(f"  col   {name:40s} {size / n:8,.1f}")
    print("\nsnapshot kinds (kind, rows, data bytes/step):")
    for kind, count, size in out["snapshot_kinds"]:
        print(f"  {kind:6s} {count:6d} {int(size) / n:8,.1f}")
    print(f"\nTOTAL {grand / n:,.0f} B/step")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--variant", default="grow")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--existing", action="store_true", help="audit what is there, run nothing")
    args = p.parse_args()
    env.setup()
    if not args.existing:
        from django.conf import settings

        from agentrun.lifecycle import services
        from bench.measure import engine_steps, inputs

        settings.AGENTRUN_ENQUEUE = False
        env.truncate()
        run = services.start_run("workload", inputs(args.variant, args.n))
        t0 = time.perf_counter()
        engine_steps(run.pk, 1, args.n + 1, time.monotonic() + 3600)
        print(f"{args.variant} N={args.n}: {time.perf_counter() - t0:.1f} s")
    show(audit(args.n), args.n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
