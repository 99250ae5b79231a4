"""A run lined up against another, step by step: a fork against its parent, usually.

Steps are aligned by number: a fork numbers its steps on from its fork point,
so step 7 of the fork is the replay of step 7 of the parent. The parent's
steps before the fork's first step are history the fork shares. Equality is
decided by content hashes only, so lining up two 1,000-step runs reads no
state at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape  # the stdlib's: same escaping as Django's, without the lazy wrapper

from django.utils.safestring import SafeString, mark_safe

from agentrun.models import Run, Snapshot
from debugger import forks, timeline
from debugger.formats import human
from debugger.timeline import _css as css

SHARED_SHOWN = 2  # steps of shared history shown before the fork's own; the rest fold away


@dataclass
class Side:
    """One run's step at an aligned position, or nothing."""

    row: timeline.Row | None
    pre: str | None = None  # content hashes of its snapshots
    post: str | None = None


@dataclass
class Aligned:
    number: int
    left: Side  # the run compared with (the parent by default)
    right: Side  # the run being looked at (the fork)
    shared: bool  # before the right run's first step: not part of its own history

    @property
    def pre_same(self) -> bool | None:
        return _same(self.left.pre, self.right.pre)

    @property
    def post_same(self) -> bool | None:
        return _same(self.left.post, self.right.post)


def _same(a: str | None, b: str | None) -> bool | None:
    return None if a is None or b is None else a == b


@dataclass
class Comparison:
    left: Run
    right: Run
    rows: list[Aligned]
    ancestor: bool  # the left run is in the right one's lineage: its early steps are shared
    first_divergence: int | None
    recorded: bool  # first_divergence is the engine's recorded divergence, not a hash test

    @property
    def aligned(self) -> int:
        return sum(1 for r in self.rows if r.post_same is not None)

    @property
    def differs_before(self) -> bool:
        """The states differ already before the first divergent step (an edited fork state,
        or runs that were never the same): not something that step did."""
        row = next((r for r in self.rows if r.number == self.first_divergence), None)
        return row is not None and row.pre_same is False

    @property
    def shared_rows(self) -> list[Aligned]:
        return [r for r in self.rows if r.shared]

    @property
    def own_rows(self) -> list[Aligned]:
        return [r for r in self.rows if not r.shared]


def _hashes(run: Run) -> dict[tuple[int, str], str]:
    return {
        (step, at): h
        for step, at, h in Snapshot.objects.filter(run=run).values_list("step", "at", "hash")
    }


def _side(rows: dict[int, timeline.Row], hashes: dict[tuple[int, str], str], n: int) -> Side:
    row = rows.get(n)
    if row is None:
        return Side(None)
    return Side(row, hashes.get((n, "pre")), hashes.get((n, "post")))


def align(left: Run, right: Run) -> Comparison:
    """`right` (a fork) step by step against `left` (its parent, or any run)."""
    left_rows = {r.number: r for r in timeline.rows(left)}
    right_rows = {r.number: r for r in timeline.rows(right)}
    left_hashes, right_hashes = _hashes(left), _hashes(right)
    rows = [
        Aligned(
            n,
            _side(left_rows, left_hashes, n),
            _side(right_rows, right_hashes, n),
            shared=n < right.first_step and n not in right_rows,
        )
        for n in sorted(left_rows.keys() | right_rows.keys())
    ]
    ancestor = any(r.pk == left.pk for r in right.lineage()[:-1])
    first = next((r.number for r in rows if not r.shared and r.post_same is False), None)
    recorded = False
    if first is None and right.parent_id == left.pk and right.divergence_step is not None:
        first, recorded = right.divergence_step, True
    return Comparison(left, right, rows, ancestor, first, recorded)


# --- the aligned rows, as HTML ------------------------------------------------------------
# Two 1,000-step runs make 1,000 rows of two sides each: built here, like the run page's
# step list, about 20x faster than a template loop. Every value from a run goes through escape().


def rows_html(cmp: Comparison, step_url: str, selected: int | None) -> SafeString:
    """One <a class="crow"> per step number: parent side, equality marks, fork side."""
    shared = cmp.shared_rows
    folded = shared[:-SHARED_SHOWN] if len(shared) > SHARED_SHOWN + 2 else []
    parts = []
    if folded:
        what = "shared history" if cmp.ancestor else f"{str(cmp.left.pk)[:8]} only"
        parts.append(
            f'<details class="shared-more"><summary>{len(folded)} earlier steps of {escape(what)}'
            "</summary>"
        )
        parts.extend(_row_html(cmp, r, step_url, selected) for r in folded)
        parts.append("</details>")
    parts.extend(_row_html(cmp, r, step_url, selected) for r in cmp.rows[len(folded) :])
    return mark_safe("".join(parts))  # noqa: S308 - escaped above


def _row_html(cmp: Comparison, r: Aligned, step_url: str, selected: int | None) -> str:
    classes = "".join(
        f" {name}"
        for name, on in (
            ("shared", r.shared),
            ("differs", r.post_same is False),
            ("first-div", r.number == cmp.first_divergence),
            ("sel", r.number == selected),
        )
        if on
    )
    url = escape(f"{step_url}{r.number}")
    return (
        f'<a class="crow{classes}" data-n="{r.number}" href="{url}" hx-get="{url}" '
        'hx-target="#compare-diff" hx-swap="outerHTML" hx-push-url="true">'
        f'<span class="n">{r.number}</span>{_side_html(cmp, r, r.left)}{_marks_html(cmp, r)}'
        f"{_side_html(cmp, r, r.right)}</a>"
    )


def _side_html(cmp: Comparison, r: Aligned, side: Side) -> str:

    row = side.row
    if row is None:
        if r.shared:
            text = "shared history" if cmp.ancestor else "before its first step"
        else:
            text = f"no step {r.number}"
        return f'<span class="side"><span class="muted">{text}</span></span>'
    status = (
        f' <span class="badge st-{css(row.status)}">{escape(row.status)}</span>'
        if row.status != "succeeded"
        else ""
    )
    chips = "".join(
        f'<span class="chip kind-{css(kind)} cs-{css(st)}" title="{escape(kind)} · '
        f'{escape(human(st))}">{escape(tool)} <span class="cstat">{escape(human(st))}</span></span>'
        for tool, kind, st in row.tools
    )
    thought = escape(row.thought or "(no thought recorded)")
    return (
        f'<span class="side"><span class="thought" hx-disable>{thought}</span>{status}'
        f'<span class="tools">{chips}</span></span>'
    )


def _mark_html(name: str, same: bool | None) -> str:
    cls, sign, words = {
        True: ("same", "=", "identical"),
        False: ("diff", "≠", "different"),
        None: ("none", "–", "only one run has it"),
    }[same]
    when = "before" if name == "pre" else "after"
    return f'<span class="eq {cls}" title="state {when} the step: {words}">{name} {sign}</span>'


def _marks_html(cmp: Comparison, r: Aligned) -> str:
    if r.shared:
        marks = '<span class="eq none" title="the fork starts after this step">shared</span>'
    else:
        marks = _mark_html("pre", r.pre_same) + _mark_html("post", r.post_same)
    if r.number == cmp.first_divergence:
        marks += '<span class="first-label">first divergence</span>'
    return f'<span class="eqcol">{marks}</span>'


# --- the picker: runs worth comparing with, without pasting an id ------------------------

RECENT = 10  # newest runs offered besides the lineage
SIBLINGS = 10


@dataclass
class Pick:
    run: Run
    relation: str  # "parent", "ancestor", "fork", "fork of a fork", "sibling", "recent"
    point: str = ""  # where a fork starts: "step 4 pre"


@dataclass
class PickGroup:
    title: str
    picks: list[Pick]


def picker(run: Run) -> list[PickGroup]:
    """The run's lineage (ancestors, forks, siblings) and the newest other runs.

    A run appears once, in the first group that has it. Empty groups are left out.
    """
    seen = {run.pk}

    def keep(picks: list[Pick]) -> list[Pick]:
        out = [p for p in picks if p.run.pk not in seen]
        seen.update(p.run.pk for p in out)
        return out

    chain = forks.lineage(run)[:-1]  # oldest first; the run itself is last
    family = [
        Pick(n.run, "parent" if n.run.pk == run.parent_id else "ancestor", n.point)
        for n in reversed(chain)
    ]
    for child in forks.tree(run):
        family.append(Pick(child.run, "fork", child.point))
        family.extend(Pick(g.run, "fork of a fork", g.point) for g in child.children)
    groups = [PickGroup("Lineage", keep(family))]
    if run.parent_id:
        siblings = Run.objects.filter(parent_id=run.parent_id).exclude(pk=run.pk)
        groups.append(
            PickGroup(
                "Sibling forks",
                keep([Pick(r, "sibling") for r in siblings.order_by("-created_at")[:SIBLINGS]]),
            )
        )
    recent = Run.objects.exclude(pk__in=seen).order_by("-created_at", "pk")[:RECENT]
    groups.append(PickGroup("Recent runs", keep([Pick(r, "recent") for r in recent])))
    return [g for g in groups if g.picks]
