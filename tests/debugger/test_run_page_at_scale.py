"""The run page of a long run: a binned strip, a windowed step list, a bounded page."""

from __future__ import annotations

import re

import pytest

from agentrun.models import Run
from debugger import timeline
from tests.debugger import runs
from tests.debugger.conftest import HX
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db

STEPS = 3000


def rows_in(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-n="(\d+)" class="row', html)]


def test_the_page_of_a_3000_step_run_stays_under_200_kb(client_for, people):
    run = long_run(people["operator"], STEPS)
    response = client_for("viewer").get(f"/runs/{run.pk}/")
    html = response.content.decode()
    assert len(response.content) < 200_000
    cells = re.findall(r'data-lo="(\d+)" data-hi="(\d+)" class="cell bin', html)
    assert 0 < len(cells) <= timeline.MAX_CELLS
    # The cells cover every step once, in order.
    assert int(cells[0][0]) == 1 and int(cells[-1][1]) == STEPS
    assert all(int(b[0]) == int(a[1]) + 1 for a, b in zip(cells, cells[1:], strict=False))
    listed = rows_in(html)
    assert len(listed) == timeline.LIST_PAGE and STEPS in listed  # opens on the last step
    assert response.context["selected"] == STEPS
    assert "later steps" not in html and "earlier steps" in html
    assert html.count("M") < 20_000  # the charts are binned too


def test_a_deep_link_into_the_middle_shows_the_rows_around_it(client_for, people):
    run = long_run(people["operator"], STEPS)
    html = client_for("viewer").get(f"/runs/{run.pk}/steps/1500/").content.decode()
    listed = rows_in(html)
    assert 1500 in listed and listed == list(range(listed[0], listed[0] + len(listed)))
    assert listed[0] < 1500 < listed[-1]
    assert f'href="/runs/{run.pk}/steps/1499/"' in html and 'rel="next"' in html
    assert re.search(r'data-lo="(\d+)" data-hi="(\d+)" class="cell bin [^"]*sel', html)
    more = re.findall(r'hx-get="(/runs/[^"]+\?(?:before|after)=\d+)"', html)
    assert len(more) == 2


def test_the_list_loads_the_next_and_previous_pages_and_a_window_around_a_step(client_for, people):
    run = long_run(people["operator"], STEPS)
    client = client_for("viewer")
    after = client.get(f"/runs/{run.pk}/?after=1000", **HX).content.decode()
    assert rows_in(after) == list(range(1001, 1001 + timeline.LIST_PAGE))
    assert f"after={1000 + timeline.LIST_PAGE}" in after
    before = client.get(f"/runs/{run.pk}/?before=1000", **HX).content.decode()
    assert rows_in(before) == list(range(1000 - timeline.LIST_PAGE, 1000))
    assert f"before={1000 - timeline.LIST_PAGE}" in before
    around = client.get(f"/runs/{run.pk}/?around=2222", **HX).content.decode()
    assert around.lstrip().startswith('<aside id="step-list"') and 2222 in rows_in(around)
    last = client.get(f"/runs/{run.pk}/?after={STEPS - 10}", **HX).content.decode()
    assert rows_in(last) == list(range(STEPS - 9, STEPS + 1)) and "after=" not in last


@pytest.mark.parametrize("query", ["after=x", "before=-3", "around=99999999999"])
def test_a_bad_list_position_is_a_400(client_for, people, query):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/?{query}", **HX)
    assert response.status_code == 400


def test_a_short_run_keeps_one_cell_per_step_and_lists_every_step(client_for, people):
    run = long_run(people["operator"], 120)
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert len(re.findall(r'data-n="\d+" class="cell ', html)) == 120
    assert rows_in(html) == list(range(1, 121))
    assert "earlier steps" not in html


def test_the_legend_lists_waiting_once(client_for, people):
    for run in (runs.walkthrough_run(people["operator"]), long_run(people["operator"], 500)):
        html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
        legend = re.search(r'<ul class="legend".*?</ul>', html, re.S).group(0)
        labels = re.findall(r"</span>([^<]+)</li>", legend)
        assert labels.count("waiting") == 1 and "failed" in labels, labels


def test_a_long_strip_colours_each_cell_by_its_worst_step(client_for, people):
    run = long_run(people["operator"], 1000, retried=(333,), backoff={777: 7.5})
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    cells = dict(re.findall(r'data-lo="(\d+)" data-hi="\d+" class="cell bin ([\w-]+)', html))
    size = -(-1000 // timeline.MAX_CELLS)
    assert cells[str(333 - (333 - 1) % size)] == "k-retried"
    assert cells[str(777 - (777 - 1) % size)] == "k-retried"
    assert cells[str(1000 - (1000 - 1) % size)] == "k-answer"
    assert cells["1"] == "k-read"
    assert cells[str(11 - (11 - 1) % size)] in ("k-write", "k-read")
    assert "k-write" in cells.values()


# --- where the page opens -------------------------------------------------------------


def test_a_run_opens_on_its_first_failed_step(client_for, people):
    run = long_run(people["operator"], 600, failed=450, retried=(100,))
    response = client_for("viewer").get(f"/runs/{run.pk}/")
    assert response.context["selected"] == 450
    assert 450 in rows_in(response.content.decode())


def test_a_run_without_failures_opens_on_its_first_retried_step(client_for, people):
    run = long_run(people["operator"], 600, retried=(120, 300))
    response = client_for("viewer").get(f"/runs/{run.pk}/")
    assert response.context["selected"] == 120
    assert 'data-step="120"' in response.content.decode()


def test_a_plain_run_opens_on_its_last_step(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    assert client_for("viewer").get(f"/runs/{run.pk}/").context["selected"] == 8


def test_a_fork_opens_on_its_first_step_that_diverged_from_its_parent(client_for, people):
    from agentrun.lifecycle import services
    from tests.base import drive

    parent = runs.walkthrough_run(people["operator"])
    fork = services.fork_run(
        parent, step=3, at="pre", state=None, mode="sandbox", reason="", user=people["operator"]
    )
    drive(fork)
    # Sandbox mode skips the write at step 3: its state differs from there on.
    expected = timeline.first_divergence(Run.objects.get(pk=fork.pk))
    assert expected is not None and expected >= 3
    response = client_for("viewer").get(f"/runs/{fork.pk}/")
    assert response.context["selected"] == expected
    Run.objects.filter(pk=fork.pk).update(divergence_step=5)  # the engine's record wins
    assert client_for("viewer").get(f"/runs/{fork.pk}/").context["selected"] == 5


def test_a_deep_link_still_opens_its_own_step(client_for, people):
    run = long_run(people["operator"], 300, failed=200)
    assert client_for("viewer").get(f"/runs/{run.pk}/steps/20/").context["selected"] == 20


# --- the duration chart -----------------------------------------------------------------


def test_a_step_that_backed_off_is_drawn_with_its_backoff(client_for, people):
    run = long_run(people["operator"], 40, backoff={7: 7.5})
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert 'class="bar-backoff"' in html
    chart = client_for("viewer").get(f"/runs/{run.pk}/").context["duration_chart"]
    assert chart.max_value >= 7500  # 7.5 s of backoff, not the step's few ms of work
    assert "backoff" in html and "waits" in html


@pytest.mark.parametrize("status", ["succeeded", "failed", "waiting", "running"])
@pytest.mark.parametrize("attempts", [1, 2])
@pytest.mark.parametrize("did", range(16))
def test_a_marks_rank_is_the_place_of_its_severity(status, attempts, did):
    mark = timeline.Mark(1, status, "executing", attempts, None, None, None, did=did)
    severity = mark.severity
    expected = timeline.SEVERITY.index(severity) if severity else len(timeline.SEVERITY)
    assert mark.rank == expected


def test_a_step_page_shows_its_own_pre_and_post_snapshots(client_for, people):
    run = long_run(people["operator"], 20, with_snapshots=True)
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/7/")
    snaps = response.context["sv"].snapshots
    assert {at: (s.step, s.at) for at, s in snaps.items()} == {
        "pre": (7, "pre"),
        "post": (7, "post"),
    }


def _marks(*specs):
    return [
        timeline.Mark(n, status, "executing", attempts, dur, 10, wall)
        for n, (status, attempts, dur, wall) in enumerate(specs, start=1)
    ]


def test_the_opening_step_is_the_first_failed_then_waiting_then_retried_then_the_last():
    run = Run(agent="scripted")
    ok, retried = ("succeeded", 1, 1.0, 1.0), ("succeeded", 2, 1.0, 1.0)
    waiting, failed = ("waiting", 1, None, None), ("failed", 1, 1.0, 1.0)
    assert timeline.opening_step(run, _marks(ok, retried, waiting, ok, failed)) == 5
    assert timeline.opening_step(run, _marks(ok, retried, waiting, waiting)) == 3
    assert timeline.opening_step(run, _marks(ok, retried, ok, retried)) == 2
    assert timeline.opening_step(run, _marks(ok, ok, ok)) == 3
    assert timeline.opening_step(run, []) is None


def test_a_chart_column_shows_the_first_of_its_slowest_steps():
    ok = ("succeeded", 1, 1.0, 1.0)
    slow_work, slow_wall = ("succeeded", 1, 9.0, 2.0), ("failed", 1, 1.0, 9.0)
    marks = _marks(*([ok] * 1000), slow_work, ok, slow_wall, *([ok] * 1997))  # 10 a column
    points = timeline.chart_points_of(marks)
    column = next(p for p in points if p.number >= 1000)
    assert column.number == 1001 and column.failed  # the tie goes to the first; 1003 failed


def test_a_finished_long_runs_steps_are_read_once_until_it_changes(
    people, django_assert_num_queries
):
    """The run page, each search and each list page read the run's steps (timeline.marks):
    a finished run's are kept by the process, keyed by what the page polls and the
    newest step id, so a change of either reads them again."""
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.models import Step

    run = long_run(people["operator"], 600)
    timeline.forget_marks()
    first = timeline.marks(run)
    with django_assert_num_queries(1):  # the newest step id
        assert timeline.marks(run) is first
    # A step row the run's own row does not know of (as after an import under its id).
    now = timezone.now()
    Step.objects.create(run=run, number=601, status="succeeded", started_at=now, finished_at=now)
    added = timeline.marks(run)
    assert added is not first and added[-1].number == 601
    # The run's row changes (what the page polls): its steps are read again.
    Step.objects.filter(run=run, number=600).update(status="failed")
    Run.objects.filter(pk=run.pk).update(status="failed", finished_at=now + timedelta(seconds=1))
    run.refresh_from_db()
    again = timeline.marks(run)
    assert again is not added and again[599].failed


def test_an_active_short_or_oversized_run_is_read_every_time(people, monkeypatch):
    short = long_run(people["operator"], timeline.MARKS_CACHED_FROM - 1)
    active = long_run(people["operator"], 600, status="running")
    big = long_run(people["operator"], 600)
    monkeypatch.setattr(timeline, "MARKS_CACHE_STEPS", 599)  # more than the cache holds
    timeline.forget_marks()
    for run in (short, active, big):
        assert timeline.marks(run) is not timeline.marks(run)


def test_a_purged_runs_steps_are_read_again(people):
    """A purge deletes steps and marks the run with `update()`: neither the run's version
    nor its newest step id need change, so a purged run is never served from the cache."""
    from django.utils import timezone

    from agentrun.models import Step

    run = long_run(people["operator"], 700)
    timeline.forget_marks()
    assert len(timeline.marks(run)) == 700
    Step.objects.filter(run=run, number__lt=600).delete()  # the newest step is kept
    Run.objects.filter(pk=run.pk).update(purged_at=timezone.now())
    run.refresh_from_db()
    assert len(timeline.marks(run)) == 101


def _marks_from_the_orm(run: Run) -> list[tuple]:
    """What read_marks must say, from the model objects, one step at a time."""
    from django.utils import timezone

    from agentrun.models import Event, Step, ToolCall

    now = timezone.now()
    bits = {"read": timeline.DID_READ, "write": timeline.DID_WRITE, "hybrid": timeline.DID_HYBRID}
    out = []
    for step in Step.objects.filter(run=run).order_by("number"):
        did = 0
        for call in ToolCall.objects.filter(step=step):
            did |= bits.get(call.kind, 0)
        if step.phase_after == "done" and step.status == "succeeded":
            did |= timeline.DID_ANSWER
        if step.finished_at is not None:
            wall = (step.finished_at - step.started_at).total_seconds() * 1000
        elif step.status in ("running", "waiting"):
            wall = (now - step.started_at).total_seconds() * 1000
        else:
            wall = None
        waits = Event.objects.filter(run=run, step=step.number, kind__in=timeline.WAIT_EVENTS)
        backoff = sum(
            e.payload.get(timeline.BACKOFF_EVENTS.get(e.kind, ""), 0) * 1000 for e in waits
        )
        phase = step.phase_after or step.phase_before or ""
        out.append(
            (step.number, step.status, phase, step.attempts, step.duration_ms, step.state_size)
            + (wall, did, backoff, waits.exists())
        )
    return out


def test_a_runs_marks_say_what_its_steps_calls_and_waits_say(people):
    """read_marks has the database join the calls and compute the wall times: every
    field of every mark against the same read from the model objects, one step at a
    time, for every kind of call, a step with two kinds, an answer, a failure, an open
    step, a step with no phase after it and the wait events."""
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.models import Event, Step, ToolCall

    run = long_run(people["operator"], 40, backoff={7: 7.5}, retried=(9,))
    now = timezone.now()
    open_step = Step.objects.create(
        run=run, number=41, status="running", started_at=now - timedelta(seconds=3)
    )
    Step.objects.filter(run=run, number=12).update(phase_after="", phase_before="reflecting")
    Step.objects.filter(run=run, number=13).update(status="failed", finished_at=None)
    step_20 = Step.objects.get(run=run, number=20)  # a read and a write already
    ToolCall.objects.create(
        run=run, step=step_20, index=2, tool="reserve", kind="hybrid", args={}, args_hash="0a",
        idempotency_key=f"{run.pk}:20:2:reserve", status="ok",
    )  # fmt: skip
    ToolCall.objects.create(
        run=run, step=open_step, index=0, tool="reserve", kind="hybrid", args={}, args_hash="0b",
        idempotency_key=f"{run.pk}:41:0:reserve", status="running",
    )  # fmt: skip
    Event.objects.create(
        run=run, step=41, kind="step_crashed", actor="system", payload={"retry_in_s": 2.0}
    )
    run.refresh_from_db()
    marks = timeline.read_marks(run)
    got = [
        (m.number, m.status, m.phase, m.attempts, m.duration_ms, m.state_size)
        + (m.wall_ms, m.did, m.backoff_ms, m.waited)
        for m in marks
    ]
    want = _marks_from_the_orm(run)
    assert [g[:6] + g[7:] for g in got] == [w[:6] + w[7:] for w in want]
    for g, w in zip(got, want, strict=True):  # the open step's wall time counts to now
        assert (g[6] is None) == (w[6] is None)
        if g[6] is not None:
            assert abs(g[6] - w[6]) < (5_000 if g[0] == 41 else 0.1), g[0]  # julianday: 0.02 ms
    assert {m.number for m in marks if m.did & timeline.DID_HYBRID} == {20, 41}
    assert marks[-1].wall_ms >= 3000 and marks.moving
    assert marks.calls == ToolCall.objects.filter(run=run).count()
    assert (
        marks.side_effects == ToolCall.objects.filter(run=run, kind__in=("write", "hybrid")).count()
    )
