"""A design probe, not a figure of the product: what a finished run's deltas would cost
stored in groups (one compressed stream for K consecutive deltas) instead of one stream each.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ar_watch_bench \\
        .venv/bin/python bench/bench_grouped_deltas.py [--run RUN_ID ...] [--repeat 5]

Reads the runs' chains as the watch scan does (`snapshots.chain_texts`: one query, raw
SQL, bytea in binary) and reports, for the deltas as stored and regrouped in memory
(K = 16, 64, 256; the texts joined by newlines, zlib at the column's level):
the compressed bytes, and the time to inflate all of them (ISA-L when it is installed,
as `models._decompress`), best and median of --repeat. Without --run: every run of the
database with at least 1,000 deltas (bench_watch.py's grow and flat runs).

Why: a value that every step may change (a negative index: `messages[-1].role`) makes the
history read and inflate every delta, and a stream's inflate costs about the same
however short the stream (bench/RESULTS.md#watch). Nothing is written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
os.environ.setdefault("AGENTRUN_VAR_DIR", "/tmp/agentrun-watch-bench")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.db.models import Count  # noqa: E402

from agentrun.models import CompressedJSONField, Snapshot, SnapshotKind  # noqa: E402
from agentrun.store import rawsql, snapshots  # noqa: E402
from agentrun.store.codec import _decompress  # noqa: E402

GROUPS = (16, 64, 256)


def timed(fn: Any, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return min(times), statistics.median(times)


def stored_deltas(run_id: Any) -> list[bytes]:
    sql = (
        f"SELECT {rawsql.column(Snapshot, 'data')} FROM {rawsql.table(Snapshot)}"  # noqa: S608
        f" WHERE {rawsql.column(Snapshot, 'run_id')} = %s AND {rawsql.column(Snapshot, 'kind')} = %s"
        f" ORDER BY {rawsql.column(Snapshot, 'seq')}"
    )
    rows = rawsql.fetch_all(
        sql, [rawsql.prep(Snapshot, "run_id", run_id), SnapshotKind.DELTA.value], binary=True
    )
    return [bytes(data) for (data,) in rows if data is not None]


def probe(run_id: Any, repeat: int) -> list[dict[str, Any]]:
    last = Snapshot.objects.filter(run_id=run_id).order_by("-seq").values_list("seq", flat=True)[0]
    texts = [t for _, kind, t in snapshots.chain_texts(run_id, 0, last) if kind == "delta" and t]
    blobs = stored_deltas(run_id)
    plain = [b for b in blobs if b[:1] not in (b"\x01", b"\x02")]
    out = [
        {
            "layout": "one stream a delta (as stored)",
            "streams": len(blobs),
            "bytes": sum(map(len, blobs)),
            # Plain streams only: packed ones need their keyframe's dictionary (Inflater).
            "inflate": timed(lambda: [_decompress(b) for b in plain], repeat)
            if len(plain) == len(blobs)
            else None,
        }
    ]
    for k in GROUPS:
        level = CompressedJSONField.level
        groups = [
            zlib.compress(b"\n".join(texts[i : i + k]), level) for i in range(0, len(texts), k)
        ]
        out.append(
            {
                "layout": f"groups of {k}",
                "streams": len(groups),
                "bytes": sum(map(len, groups)),
                "inflate": timed(lambda groups=groups: [_decompress(g) for g in groups], repeat),
            }
        )
    for row in out:
        row["text bytes"] = sum(map(len, texts))
        row["deltas"] = len(texts)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = args.run or [
        str(r)
        for r in Snapshot.objects.filter(kind=SnapshotKind.DELTA)
        .values("run_id")
        .annotate(n=Count("*"))
        .filter(n__gte=1000)
        .values_list("run_id", flat=True)
    ]
    print(f"{connection.vendor}, zlib level {CompressedJSONField.level}, repeat {args.repeat}\n")
    print(
        "| run | layout | streams | stored bytes | of the deltas' text | inflate all: best / median |"
    )
    print("|---|---|---|---|---|---|")
    for run_id in runs:
        for row in probe(run_id, args.repeat):
            inflate = row["inflate"]
            cell = "–" if inflate is None else f"{inflate[0]:.0f} / {inflate[1]:.0f} ms"
            print(
                f"| {str(run_id)[:8]} ({row['deltas']:,} deltas) | {row['layout']} | {row['streams']:,}"
                f" | {row['bytes']:,} | {row['bytes'] / row['text bytes']:.0%} | {cell} |"
            )


if __name__ == "__main__":
    main()
