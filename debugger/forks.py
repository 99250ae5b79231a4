"""Forks as the debugger shows them: where a run came from, and what was forked from it.

A fork point is a snapshot of the parent (step, pre|post). These helpers read
the few columns the run header needs, never a snapshot's data: a fork's
source snapshot may be a keyframe of a 2.5 MB state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from agentrun.agents import InvalidInput, get_agent
from agentrun.lifecycle import services
from agentrun.models import Event, Run, Snapshot
from agentrun.store.delta import state_hash
from debugger.diffs import StateDiff, diff_states
from debugger.forms import ForkStateForm
from debugger.states import load_states

CHILDREN = 50  # forks listed per run in the tree; more are counted, not listed


@dataclass
class Node:
    """A run in a lineage or a fork tree, with the point it was forked from."""

    run: Run
    step: int | None = None
    at: str = ""
    children: list[Node] = field(default_factory=list)
    more: int = 0  # children not listed

    @property
    def point(self) -> str:
        """'step 6 pre', or '' for a run that is not a fork."""
        return f"step {self.step} {self.at}" if self.step is not None else ""


def _points(runs: list[Run]) -> dict[int, tuple[int, str]]:
    ids = [r.forked_from_id for r in runs if r.forked_from_id]
    if not ids:
        return {}
    return {
        pk: (step, at)
        for pk, step, at in Snapshot.objects.filter(pk__in=ids).values_list("pk", "step", "at")
    }


def _node(run: Run, points: dict[int, tuple[int, str]]) -> Node:
    point = points.get(run.forked_from_id) if run.forked_from_id else None
    return Node(run, *point) if point else Node(run)


def fork_point(run: Run) -> str:
    """'step 6 pre' for a fork, '' for a run that is not one."""
    return _node(run, _points([run])).point


def lineage(run: Run) -> list[Node]:
    """The parent chain, oldest first, ending with this run; [] for a run that is no fork."""
    if not run.parent_id:
        return []
    chain = run.lineage()
    points = _points(chain)
    return [_node(r, points) for r in chain]


def tree(run: Run) -> list[Node]:
    """The forks of this run and their forks (two levels), oldest first."""
    children = _forks_of([run]).get(run.pk, [])
    grandchildren = _forks_of([c.run for c in children])
    for child in children:
        child.children = grandchildren.get(child.run.pk, [])
    return children


def _forks_of(parents: list[Run]) -> dict[Any, list[Node]]:
    """{parent id: its forks}, at most CHILDREN each; the last one counts the rest."""
    if not parents:
        return {}
    runs = list(
        Run.objects.filter(parent__in=parents)
        .select_related("created_by")
        .order_by("created_at", "pk")
    )
    points = _points(runs)
    by_parent: dict[Any, list[Node]] = {}
    for r in runs:
        nodes = by_parent.setdefault(r.parent_id, [])
        if len(nodes) < CHILDREN:
            nodes.append(_node(r, points))
        else:
            nodes[-1].more += 1
    return by_parent


def fork_event(run: Run) -> Event | None:
    """The run_forked event: who forked, why, and whether the state was edited."""
    if not run.parent_id:
        return None
    return Event.objects.filter(run=run, kind="run_forked").order_by("created_at", "id").first()


def state_text(state: Any) -> str:
    """The state as the fork form's editor shows it: pretty JSON, keys in their order."""
    return json.dumps(state, indent=2, ensure_ascii=False)


# --- the fork page's live check of an edited state ----------------------------------------


@dataclass
class StateCheck:
    """What the fork page says about an edited state while it is being edited.

    `errors` are what forking with it would refuse; `diff` is the snapshot → edited
    state diff the fork would start from (None when the text is no JSON to compare).
    """

    errors: list[str] = field(default_factory=list)
    diff: StateDiff | None = None
    checked: bool = True  # False: only the diff is known (the page without the live check)
    error_path: str | None = None  # the part of the state an error is about, if known

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def unchanged(self) -> bool:
        return self.diff is not None and self.diff.identical


def check_state(run: Run, source: Snapshot, text: str | None) -> StateCheck:
    """The checks a fork from `source` makes of the edited state `text`, without forking."""
    form = ForkStateForm({"state": text})
    if not form.is_valid():
        return StateCheck(errors=[str(e) for e in form.errors["state"]])
    state = form.cleaned_data["state"]
    [original] = load_states([source])
    check = StateCheck(diff=diff_states(original, state, source.size))
    try:
        if state_hash(state) != source.hash:
            services.check_fork_state(get_agent(run.agent), state)
        services.check_fork_phase(state)
    except services.ForkError as exc:
        check.errors.append(_sentence(str(exc).removeprefix("state: ")))
        check.error_path = exc.path
    except InvalidInput as exc:  # the run's agent is not registered in this deployment
        check.errors.append(_sentence(f"Can't fork this run: {exc}"))
    return check


def upload_limit() -> int:
    """Bytes a form post may carry (the page's script won't send a larger state to check)."""
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)


def _sentence(text: str) -> str:
    return text if text.endswith(".") else f"{text}."
