"""Runs to export, and archives to read and rewrite, for the export/import tests."""

from __future__ import annotations

import gzip
import io
import json
from typing import Any

from agentrun.lifecycle import archive, services
from agentrun.models import Run, Snapshot
from agentrun.store import snapshots
from tests.base import calls, drive, final, make_run, script

#: Step 1 echo (read); 2 ledger_write (write) + reserve (hybrid); 3 echo; 4 the answer.
STEPS = script(
    calls({"tool": "echo", "args": {"n": 1, "note": "caf\u00e9 \u2603"}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    calls({"tool": "echo", "args": {"n": 3, "big": 1e16, "neg": -0.0}}),
    final("booked"),
)


def finished_run(user: Any = None) -> Run:
    run = drive(make_run(STEPS, user=user))
    assert run.status == "succeeded", run.error
    return run


def edited_fork(parent: Run, user: Any = None, mode: str = "sandbox") -> Run:
    """A fork of `parent` from the pre snapshot of step 3, its goal edited, run to its end."""
    state = snapshots.load(parent.pk, 3, "pre")
    state["memory"]["goal"] = "edited goal"
    fork = services.fork_run(parent, step=3, at="pre", state=state, mode=mode, user=user)
    fork = drive(fork)
    assert fork.status == "succeeded", fork.error
    return fork


def export_bytes(run: Run, ancestors: bool = False) -> bytes:
    return b"".join(archive.export_chunks(run, ancestors=ancestors))


def records(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


def pack(recs: list[dict[str, Any]], *, reseal: bool = True) -> bytes:
    """Records back into an archive; with `reseal`, a new end line that matches them."""
    lines = [
        json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        for r in recs
        if r["type"] != "end"
    ]
    end = next(r for r in recs if r["type"] == "end")
    if reseal:
        import hashlib

        end = {
            "type": "end",
            "lines": len(lines),
            "sha256": hashlib.sha256(b"".join(lines)).hexdigest(),
        }
    lines.append(json.dumps(end).encode() + b"\n")
    return gzip.compress(b"".join(lines))


def import_bytes(data: bytes, user: Any = None) -> list[Run]:
    return archive.import_archive(lambda: io.BytesIO(data), user=user)


def hashes(run_ids: list[Any]) -> list[tuple[str, int, str, str]]:
    """(run, seq, stored hash, hash of the state read back) of every snapshot of the runs."""
    from agentrun.store.hashing import digest

    return [
        (str(s.run_id), s.seq, s.hash, digest(snapshots.load_state(s)))
        for s in Snapshot.objects.filter(run_id__in=run_ids).order_by("run_id", "seq")
    ]


def row_counts() -> dict[str, int]:
    from agentrun.models import Event, Step, ToolCall

    return {m.__name__: m.objects.count() for m in (Run, Snapshot, Step, ToolCall, Event)}
