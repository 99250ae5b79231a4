"""Run ids as people type them: the whole UUID, or the first few characters of it.

Pages and command output show a run as its first 8 hex characters; every place that
asks for a run id (the compare page, the snapshot diff, `manage.py fork`) takes
those too, through `resolve_run`. A prefix names a run only while no other run's id
starts with it: an ambiguous one is refused with the runs it could mean, so a
script never acts on the wrong run. The JSON API keeps full UUIDs (its paths are
declared as `format: uuid` and a prefix that is unique today may not be tomorrow).
"""

from __future__ import annotations

import re
from uuid import UUID

from django.db.models import QuerySet

from agentrun.models import Run

MIN_PREFIX = 4  # hex characters: fewer would match a sixteenth of all runs
CANDIDATES_SHOWN = 5
_HEX = re.compile(r"[0-9a-f]+")


class RunIdError(ValueError):
    """A run id that names no run, or several. `candidates` lists the several."""

    def __init__(self, message: str, candidates: list[Run] | None = None) -> None:
        super().__init__(message)
        self.candidates = candidates or []


def resolve_run(text: str, runs: QuerySet[Run] | None = None) -> Run:
    """The run whose id is `text` or starts with it (dashes optional, any case).

    Raises RunIdError for text that is not (part of) a run id, a prefix shorter than
    MIN_PREFIX, no matching run, or a prefix that several runs share (with up to
    CANDIDATES_SHOWN of them, newest first, in `candidates`).
    """
    runs = Run.objects.all() if runs is None else runs
    raw = text.strip()
    compact = raw.lower().replace("-", "")
    shown = raw[:40]
    if not compact or not _HEX.fullmatch(compact) or len(compact) > 32:
        raise RunIdError(
            f"{shown!r} is not a valid run id: give the id or its first {MIN_PREFIX} or more "
            "hex characters, as in 3f2a9c1e"
        )
    if len(compact) == 32:
        run = runs.filter(pk=UUID(compact)).first()
        if run is None:
            raise RunIdError(f"no run {UUID(compact)}")
        return run
    if len(compact) < MIN_PREFIX:
        raise RunIdError(
            f"{shown!r} is too short to name a run: give at least {MIN_PREFIX} characters"
        )
    # The ids that start with the prefix are a range of UUIDs: a primary key range scan on
    # either database (no cast of every id to text, which reads the whole table).
    first, last = UUID(compact.ljust(32, "0")), UUID(compact.ljust(32, "f"))
    matches = list(
        runs.filter(pk__range=(first, last)).order_by("-created_at", "pk")[: CANDIDATES_SHOWN + 1]
    )
    if not matches:
        raise RunIdError(f"no run has an id starting with {compact!r}")
    if len(matches) > 1:
        listed = ", ".join(distinct_prefix(r, matches) for r in matches[:CANDIDATES_SHOWN])
        more = " and more" if len(matches) > CANDIDATES_SHOWN else ""
        raise RunIdError(
            f"{compact!r} matches several runs ({listed}{more}): give more characters",
            candidates=matches[:CANDIDATES_SHOWN],
        )
    return matches[0]


def distinct_prefix(run: Run, among: list[Run]) -> str:
    """The run's id cut where it stops sharing a prefix with the others (8 at least)."""
    mine = run.pk.hex
    longest = max((_common(mine, other.pk.hex) for other in among if other.pk != run.pk), default=0)
    return mine[: max(8, longest + 1)]


def _common(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
