"""A finished run's deltas, regrouped: one compressed stream for GROUP_SIZE deltas.

While a run runs, each step's delta is compressed on its own (or against its keyframe's
text), as the step commits it. A long run's history is then thousands of short streams,
and reading it back (a path's history, the whole history, an export) inflates each one:
a stream costs about the same to inflate however short it is. Once the run has ended, a
worker regroups its deltas (`compact`): the texts of up to GROUP_SIZE consecutive deltas
in one zlib stream, kept by the first of them (the holder), and each other delta's value
naming its part of that text (agentrun.models: GROUP, SLICE). On the benchmark's
10,000-step runs the deltas then store about a third less and inflate in a third of the
time (bench/bench_grouped_deltas.py). What a snapshot reads as is unchanged: `inflate`
turns a grouped value into the same text.

- **Which runs.** Ended (not queued, running or waiting), not purged, with at least
  AGENTRUN_COMPACT_STEPS steps. The worker that commits the run's last step asks for it
  (`send`), and so does a cancel; `manage.py compact` does it by hand.
- **Which rows.** Deltas only: keyframes stay as they are (a delta left alone, a group
  of one, is still packed against its keyframe's text), and a group never spans a keyframe
  or a fork's first row, so a read that starts at a keyframe meets each group's holder
  before its other members. A group holds at most GROUP_MAX_BYTES of text. A delta that
  is grouped already is left alone: a second pass writes nothing.
- **A transaction a group.** Each group's rows are rewritten at once, with the run's
  row locked and its state checked again, and only if none of them was regrouped
  meanwhile: a reader sees a group before or after, never between, and the transactions
  stay short (SQLite has one writer). A reader that holds a member's value and not its
  group reads the group by its locator; the group's CRC-32, in every member, tells a
  group that is not the one it was cut from.
- **Integrity.** Every regrouped delta's new value is inflated and checked against its
  text before the write: a group that would not read back the same is not written.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import BinaryField, F
from django.db.models.functions import Substr

from agentrun.infra.queue import ask
from agentrun.models import CompressedJSONField, Run, Snapshot, SnapshotKind
from agentrun.store import snapshots
from agentrun.store.codec import group_parts, group_values, is_grouped

log = logging.getLogger(__name__)

#: A value's first byte, which says whether it is grouped already.
_HEAD = Substr(F("data"), 1, 1, output_field=BinaryField())

#: Deltas per group: 64 stores within 3% of 256 and keeps a group's text near 200 KB on
#: the benchmark's runs; and at most this many bytes of text (a state of large values).
GROUP_SIZE = 64
GROUP_MAX_BYTES = 1024 * 1024


def compactable(run: Run) -> bool:
    """Whether this run's deltas should be regrouped: ended, not purged, long enough."""
    return run.ended_with(settings.AGENTRUN_COMPACT_STEPS)


def compact(run_id: Any, group_size: int = GROUP_SIZE) -> int:
    """Regroup a run's deltas, if it should be (`compactable`); returns how many deltas
    were regrouped. The texts are read a stretch between two keyframes at a time (the
    memory they take), and each group is written in a transaction of its own: a short
    one, which SQLite's single writer needs, and a reader meets whole groups only."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not compactable(run):
        return 0
    groups = _groups(run.pk, group_size)
    done = written = 0
    stretch: list[list[tuple[int, int, int]]] = []
    for i, members in enumerate(groups):
        stretch.append(members)
        if i + 1 < len(groups) and _keyframe(groups[i + 1]) == _keyframe(members):
            continue
        texts = _texts(run.pk, stretch)
        for group in stretch:
            n = _write(run.pk, group, texts)
            if n < 0:  # the run is no longer to be regrouped (purged meanwhile)
                return done
            done += n
            written += n > 0
        stretch = []
    if done:
        log.info("run %s: %d deltas regrouped into %d groups", run.pk, done, written)
    return done


def _keyframe(members: list[tuple[int, int, int]]) -> int:
    return members[0][2]


def _write(run_id: Any, members: list[tuple[int, int, int]], texts: dict[int, bytes]) -> int:
    """Write one group: how many deltas it holds, 0 if its rows changed since they were
    read (regrouped meanwhile), -1 if the run should no longer be regrouped."""
    values = group_values(
        run_id, members[0][1], [texts[seq] for _, seq, _ in members], CompressedJSONField.level
    )
    rows = [Snapshot(pk=pk, data=value) for (pk, _, _), value in zip(members, values, strict=True)]
    # Every delta must read back as it did, before anything is written (from the new
    # values alone: a check that went through the process's cache could meet another
    # thread's eviction, or look the holder up in the table, where it is not yet).
    if group_parts([bytes(v) for v in values]) != [texts[seq] for _, seq, _ in members]:
        raise RuntimeError(f"regrouping run {run_id} would change its deltas; not written")
    with transaction.atomic():
        # FOR NO KEY UPDATE: rows that refer to the run (an event) can still be added.
        run = Run.objects.select_for_update(no_key=True).filter(pk=run_id).first()
        if run is None or not compactable(run):
            return -1
        heads = dict(
            Snapshot.objects.filter(pk__in=[pk for pk, _, _ in members]).values_list("pk", _HEAD)
        )
        if len(heads) != len(members) or any(
            h is None or is_grouped(bytes(h)) for h in heads.values()
        ):
            return 0
        Snapshot.objects.bulk_update(rows, ["data"], batch_size=len(rows))
    return len(rows)


def _groups(run_id: Any, count: int) -> list[list[tuple[int, int, int]]]:
    """The run's deltas to regroup, as lists of (pk, seq, keyframe seq): consecutive
    deltas not grouped yet, at most `count` of them and GROUP_MAX_BYTES of text (as
    `stored_bytes` says), cut at every other row with data (a keyframe, a fork's first
    row) and at grouped ones. A group of one is left as it is."""
    rows = (
        Snapshot.objects.filter(run_id=run_id)
        .exclude(kind=SnapshotKind.REF)
        .order_by("seq")
        .values_list("pk", "seq", "keyframe_seq", "kind", "stored_bytes", _HEAD)
    )
    groups: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    held = 0  # the text bytes of `current`
    for pk, seq, keyframe, kind, size, first in rows:
        if kind != SnapshotKind.DELTA or first is None or is_grouped(bytes(first)):
            if len(current) > 1:
                groups.append(current)
            current, held = [], 0
            continue
        # A new keyframe (one with no data: a purge under way), or bytes enough.
        if current and (keyframe != _keyframe(current) or held + size > GROUP_MAX_BYTES):
            if len(current) > 1:
                groups.append(current)
            current, held = [], 0
        current.append((pk, seq, keyframe))
        held += size
        if len(current) == count:
            groups.append(current)
            current, held = [], 0
    if len(current) > 1:
        groups.append(current)
    return groups


def _texts(run_id: Any, groups: list[list[tuple[int, int, int]]]) -> dict[int, bytes]:
    """The text of every delta in `groups` (of one keyframe), by seq, from one read of
    the run's chain from that keyframe."""
    wanted = {seq for members in groups for _, seq, _ in members}
    start, last = min(_keyframe(groups[0]), min(wanted)), max(wanted)
    out: dict[int, bytes] = {}
    for seq, _, text in snapshots.chain_texts(run_id, start, last, keep=wanted):
        if seq in wanted and text is not None:
            out[seq] = bytes(text)
    missing = wanted - out.keys()
    if missing:
        raise RuntimeError(f"run {run_id}: deltas {sorted(missing)[:5]} could not be read")
    return out


def send(run_id: Any) -> None:
    """Ask a worker to regroup the run's deltas once the current transaction commits (a
    message lost: `manage.py compact --all` finds the run)."""
    ask("agentrun.compact", run_id, "the regrouping")
