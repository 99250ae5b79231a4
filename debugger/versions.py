"""What the pages say about code versions: the version a run was created on, the one it
asks for and those its steps ran on; the live workers; the runs that wait for a worker of a
version no live worker runs (agentrun.engine.versions keeps the workers' rows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Max, Min

from agentrun.engine.versions import alive_workers
from agentrun.models import Run, Step, Worker

WAITING_SHOWN = 50


@dataclass(frozen=True)
class Ran:
    """One version the run's steps ran on: from step `first` to step `last`."""

    version: str
    first: int
    last: int
    steps: int


@dataclass
class RunVersions:
    created: str
    target: str
    ran: list[Ran]
    alive: list[str] = field(default_factory=list)
    active: bool = False

    @property
    def waiting(self) -> bool:
        """The run asks for a version that no live worker runs: nothing will claim it."""
        return self.active and bool(self.target) and self.target not in self.alive

    @property
    def differs(self) -> bool:
        """It ran (partly) on another version than the one that created it."""
        return bool(self.created) and any(r.version != self.created for r in self.ran)

    @property
    def ran_versions(self) -> list[str]:
        return [r.version for r in self.ran]


def ran_on(run: Run) -> list[Ran]:
    """The versions that ran the run's steps, in the order they first ran one (one query)."""
    rows = (
        Step.objects.filter(run=run)
        .exclude(code_version="")
        .values("code_version")
        .annotate(first=Min("number"), last=Max("number"), steps=Count("pk"))
        .order_by("first")
    )
    return [Ran(r["code_version"], r["first"], r["last"], r["steps"]) for r in rows]


@dataclass(frozen=True)
class Compared:
    """The versions two compared runs ran on (left: the one compared with, often the parent)."""

    left: list[str]
    right: list[str]

    @property
    def differs(self) -> bool:
        return bool(self.left) and bool(self.right) and set(self.left) != set(self.right)


def compared(left: Run, right: Run) -> Compared:
    return Compared(
        [r.version for r in ran_on(left)],
        [r.version for r in ran_on(right)],
    )


def alive_versions() -> list[str]:
    return sorted({w.version for w in alive_workers()})


def of_run(run: Run) -> RunVersions:
    return RunVersions(
        created=run.created_version,
        target=run.target_version,
        ran=ran_on(run),
        alive=alive_versions() if run.target_version and run.is_active else [],
        active=run.is_active,
    )


def waiting_for_a_worker(workers: list[Worker]) -> tuple[list[Run], int]:
    """Active runs that ask for a version none of `workers` runs, longest waiting first
    (at most WAITING_SHOWN of them), and how many there are."""
    runs = (
        Run.objects.active()
        .filter(imported_at__isnull=True)
        .exclude(target_version="")
        .exclude(target_version__in={w.version for w in workers})
    )
    shown = list(runs.defer("input").order_by("updated_at")[:WAITING_SHOWN])
    total = len(shown) if len(shown) < WAITING_SHOWN else runs.count()
    return shown, total
