"""Replaying an archive's runs in this process, in sandbox mode, and judging each fork."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from django.test.utils import override_settings

from agentrun import engine
from agentrun.agents import InvalidInput
from agentrun.lifecycle import archive, batches, services
from agentrun.models import ACTIVE_STATUSES, Run

#: Steps a replayed fork may take before it counts as stuck.
MAX_STEPS = 10_000


@dataclass
class Replayed:
    archive: str
    run: Run  # the run as it was recorded (imported)
    step: int | None  # its fork point (the pre snapshot of this step), None: skipped
    fork: Run | None
    verdict: str  # fixed, still_failing, ... or "skipped" / "error" with `detail`
    detail: str = ""

    def line(self) -> str:
        where = f"from step {self.step}" if self.step else "not replayed"
        said = f" ({self.detail})" if self.detail else ""
        return f"{self.archive}: run {str(self.run.pk)[:8]} {where}: {self.verdict}{said}"


def replay_archive(
    path: str | Path, *, start_from: Any = "before-failure", mode: str = "sandbox"
) -> list[Replayed]:
    """Import the archive and replay its run (the one exported; not its fork ancestors)."""
    path = Path(path)
    try:
        runs = archive.import_archive(partial(path.open, "rb"), user=None)
    except archive.ArchiveError as exc:
        raise ValueError(f"{path}: {exc}") from None
    run = runs[-1]
    start = batches.parse_from(start_from)
    point = batches.fork_points([run], start)[run.pk]
    if not isinstance(point, int):
        return [Replayed(str(path), run, None, None, "skipped", point)]
    try:
        with override_settings(AGENTRUN_ENQUEUE=False):
            fork = services.fork_run(
                run, step=point, at="pre", mode=mode, reason=f"replaytest {path.name}"
            )
            fork = _execute(fork)
    except (services.ForkError, InvalidInput) as exc:
        return [Replayed(str(path), run, point, None, "error", str(exc))]
    if fork.status in ACTIVE_STATUSES:
        detail = f"the fork is {fork.status} ({fork.wait_reason or 'did not end'})"
        return [Replayed(str(path), run, point, fork, "error", detail)]
    verdict = batches.verdict(run, fork, point)
    detail = fork.error if fork.status == "failed" else ""
    return [Replayed(str(path), run, point, fork, verdict, detail)]


def _execute(run: Run) -> Run:
    """Execute a run's steps here, one after another, until it stops moving."""
    for _ in range(MAX_STEPS):
        run.refresh_from_db()
        if run.status not in ("queued", "running"):
            break
        if engine.execute_step(run.pk, run.next_step).status == "not_claimed":
            break
    run.refresh_from_db()
    return run


def assert_replays(
    paths: Iterable[str | Path], *, expect: str = "fixed", start_from: Any = "before-failure"
) -> list[Replayed]:
    """Replay each archive; AssertionError listing those whose verdict is not `expect`."""
    done = [r for p in paths for r in replay_archive(p, start_from=start_from)]
    wrong = [r for r in done if r.verdict != expect]
    if wrong:
        raise AssertionError(
            f"expected every replay to be {expect!r}:\n" + "\n".join(r.line() for r in wrong)
        )
    return done
