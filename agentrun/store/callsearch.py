"""The text of a run's tool calls, for the search within a run, and its stored index.

A call's text is its arguments and its result as JSON, lower-cased. Results are stored
compressed (a read's against its step's post delta), so no SQL can look inside them: a
run is searched in one of two ways.

- **Read and scan** (debugger.search.call_text): the run's calls are read and inflated
  once into the process's memory, and searched there. At 1,000 steps the first search
  of a run takes about 40 ms; at 10,000 steps 0.4 s, most of it zlib and the rows.
- **The stored index** (`SearchBlock`), for finished runs of at least
  AGENTRUN_SEARCH_INDEX_STEPS steps: the same text in blocks of about BLOCK_CHARS, which
  PostgreSQL decompresses and searches itself (lz4; 45 ms at 10,000 steps, however many
  steps match), so even a process's first search of the run is fast. It costs bytes
  (about 1.5 KB a step for the benchmark's workload), which is why short runs, whose
  scan is as fast, have none. A worker builds it when the run ends or is cancelled
  (`send`), and a search of a long run that finds none asks for it (`request`: an
  imported run, a lost message, an index gone stale); `manage.py search_index` builds
  it by hand.

The index is valid while the run's calls are as they were when it was built: its
version holds the run's status, next step and purge mark, and the calls' count, last
step id and successes (`calls_version`); a search uses the index only when they still
match. The purge deletes it with the results.

In either text, a raw control character cannot occur (JSON escapes them), so the calls
are separated by CALL_SEP, and a call's arguments from its result by PART_SEP; a needle
holding a control character matches nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max, Q

from agentrun.infra.queue import ask
from agentrun.models import Run, SearchBlock, ToolCall, ToolCallStatus
from agentrun.store.snapshots import inflate_results

log = logging.getLogger(__name__)

CALL_SEP = "\x1e"
PART_SEP = "\x1f"
#: Characters of call text per stored block (whole calls: a block may be larger).
BLOCK_CHARS = 256 * 1024


def searchable(needle: str) -> bool:
    """Whether a needle can match call text at all: not empty, no control character."""
    return bool(needle) and not any(ord(c) < 0x20 for c in needle)


def call_part(args: str, result: str | None) -> str:
    """One call's searchable text."""
    return (args if result is None else f"{args}{PART_SEP}{result}").lower()


def stored_calls(
    run_id: Any, from_step_id: int = 0, below_step_id: int | None = None
) -> list[tuple[int, str, str | None]]:
    """(step id, arguments as JSON text, result as JSON text or None) of a run's calls,
    of the steps with an id from `from_step_id` on (and below `below_step_id`), by step:
    the one place that reads ToolCall.result's stored form (models.CompressedJSONField)
    behind the field's back."""
    table = ToolCall._meta.db_table
    pg = connection.vendor == "postgresql"
    below = "" if below_step_id is None else " AND step_id < %s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT step_id, {'args::text' if pg else 'args'}, result FROM {table} "  # noqa: S608 - names from the model
            f"WHERE run_id = %s AND step_id >= %s{below} ORDER BY step_id, id",
            [run_id if pg else run_id.hex, from_step_id]
            + ([] if below_step_id is None else [below_step_id]),
        )
        rows = cursor.fetchall()
    # A read's result is packed against its step's post delta (agentrun.store.codec.pack):
    # inflate_results reads those deltas in one pass of the run's snapshots.
    # A result whose delta a purge took away meanwhile is searched as no result.
    inflated = inflate_results(run_id, [blob for _, _, blob in rows], gone_as_none=True)
    return [
        (
            step_id,
            args if pg else json.dumps(json.loads(args), ensure_ascii=False),  # as jsonb has it
            None if text is None else text.decode(),
        )
        for (step_id, args, _), text in zip(rows, inflated, strict=True)
    ]


def calls_version(run: Run) -> tuple[Any, ...]:
    """What the run's call text depends on: (run id, status, next step, purged at, the
    calls' count, their last step id, how many succeeded), read from
    toolcall_run_tool_args alone. A call's text changes only with its status: a result
    is written when the call succeeds (also after its run ended: a side effect that
    finished after a cancel)."""
    calls = ToolCall.objects.filter(run_id=run.pk).aggregate(
        n=Count("*"), top=Max("step_id"), ok=Count("step", filter=Q(status=ToolCallStatus.OK))
    )
    return (
        run.pk,
        run.status,
        run.next_step,
        run.purged_at,
        calls["n"],
        calls["top"] or 0,
        calls["ok"],
    )


def _stamp(version: tuple[Any, ...]) -> str:
    _, status, next_step, purged_at, n, top, ok = version
    return f"{status}:{next_step}:{purged_at is not None}:{n}:{top}:{ok}"


def indexable(run: Run) -> bool:
    """Whether this run gets a stored index: ended, not purged, long enough."""
    return run.ended_with(settings.AGENTRUN_SEARCH_INDEX_STEPS)


# --- building it ---------------------------------------------------------------------------


#: Steps whose calls a build reads at a time (its memory: their text and one block).
BUILD_STEPS = 500


def build(run_id: Any) -> int:
    """Write the run's index anew, if it should have one (else delete any); returns the
    number of blocks written. Reads the whole call text, BUILD_STEPS steps at a time:
    run by a worker, not a page. The new blocks are written under a version of their own
    and take the index's place in one transaction at the end, if the run's calls are
    still as they were read; a search meanwhile uses the old index or none."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return 0
    if not indexable(run):
        SearchBlock.objects.filter(run_id=run.pk).delete()
        return 0
    version = calls_version(run)
    mine = f"building {uuid.uuid4()}"
    step_ids = sorted(set(ToolCall.objects.filter(run_id=run.pk).values_list("step_id", flat=True)))
    parts: list[str] = []
    steps: list[str] = []
    size = written = 0

    def close() -> None:
        nonlocal size, written
        SearchBlock.objects.create(
            run_id=run.pk, version=mine, steps=",".join(steps), body=CALL_SEP.join(parts)
        )
        written += 1
        parts.clear()
        steps.clear()
        size = 0

    try:
        for at in range(0, len(step_ids), BUILD_STEPS):
            below = step_ids[at + BUILD_STEPS] if at + BUILD_STEPS < len(step_ids) else None
            for step_id, args, result in stored_calls(run.pk, step_ids[at], below):
                part = call_part(args, result)
                parts.append(part)
                steps.append(str(step_id))
                size += len(part) + 1
                if size >= BLOCK_CHARS:
                    close()
        if parts or not written:
            close()  # a run with no calls: one empty block, so the index exists
        with transaction.atomic():
            # The run as read above, or the index would say so of calls it has not seen;
            # and all our blocks: a build that ended meanwhile deleted those written
            # before it, and its index stands.
            locked = Run.objects.select_for_update(no_key=True).filter(pk=run.pk).first()
            current = locked is not None and calls_version(locked) == version
            ours = SearchBlock.objects.filter(run_id=run.pk, version=mine)
            if not current:
                SearchBlock.objects.filter(run_id=run.pk).delete()
                return 0
            if ours.count() != written:
                ours.delete()
                return 0
            SearchBlock.objects.filter(run_id=run.pk).exclude(version=mine).delete()
            ours.update(version=_stamp(version))
    except BaseException:
        SearchBlock.objects.filter(run_id=run.pk, version=mine).delete()
        raise
    return written


_REQUESTED: set[Any] = set()


def request(run: Run, version: tuple[Any, ...]) -> None:
    """Have a worker build the run's index, if it should have one (a search of a long run
    that found none of this version; at most once per version and process)."""
    key = (run.pk, _stamp(version))
    if not indexable(run) or key in _REQUESTED:
        return
    if len(_REQUESTED) >= 10_000:
        _REQUESTED.clear()
    _REQUESTED.add(key)
    send(run.pk)


def send(run_id: Any) -> None:
    """Ask a worker to build the run's index once the current transaction commits (a
    message lost: a search of the run asks again)."""
    ask("agentrun.search_index", run_id, "the search index")


# --- searching it --------------------------------------------------------------------------


def indexed_steps_with(version: tuple[Any, ...], needle: str) -> set[int] | None:
    """The step ids with a call whose text holds `needle` (lower-cased already), from the
    run's stored index; None when it has no index of this version."""
    run_id, stamp = version[0], _stamp(version)
    found: set[int] = set()
    if not searchable(needle):
        return found if _indexed(run_id, stamp) else None
    table = SearchBlock._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Only the blocks that hold the needle are cut into calls, by the server.
            cursor.execute(
                f"SELECT b.steps, array_agg(p.ord) FROM {table} b "  # noqa: S608 - names from the model
                "CROSS JOIN LATERAL unnest(string_to_array(b.body, %s)) "
                "WITH ORDINALITY AS p(part, ord) "
                "WHERE b.run_id = %s AND b.version = %s AND strpos(b.body, %s) > 0 "
                "AND strpos(p.part, %s) > 0 GROUP BY b.id, b.steps",
                [CALL_SEP, run_id, stamp, needle, needle],
            )
            for steps, ords in cursor.fetchall():
                ids = steps.split(",")
                found.update(int(ids[k - 1]) for k in ords)
        else:
            cursor.execute(
                f"SELECT steps, body FROM {table} "  # noqa: S608 - names from the model
                "WHERE run_id = %s AND version = %s AND instr(body, %s) > 0",
                [run_id.hex, stamp, needle],
            )
            for steps, body in cursor.fetchall():
                ids = steps.split(",")
                found.update(
                    int(ids[k]) for k, part in enumerate(body.split(CALL_SEP)) if needle in part
                )
    # Found: the blocks were there. Not found: only if the index is (not one a build of
    # another version replaced meanwhile).
    return found if found or _indexed(run_id, stamp) else None


def _indexed(run_id: Any, stamp: str) -> bool:
    return SearchBlock.objects.filter(run_id=run_id, version=stamp).exists()


def has_index(run: Run) -> bool:
    """Whether the run has an index of its calls as they are now."""
    return _indexed(run.pk, _stamp(calls_version(run)))
