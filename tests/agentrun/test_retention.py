"""Retention purges finished runs' bulk and keeps incidents (pins and their fork lineage),
active runs and the audit trail."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agentrun.lifecycle import retention, services
from agentrun.models import Event, Run, SearchBlock, Snapshot, Step, ToolCall
from agentrun.store import snapshots
from agentrun.store.delta import state_hash
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

#: Steps 1 echo (read); 2 ledger_write (write) + reserve (hybrid); 3 echo; 4 the answer.
SIDE_EFFECTS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    calls({"tool": "echo", "args": {"n": 3}}),
    final("booked"),
)
READS = script(*[calls({"tool": "echo", "args": {"n": i}}) for i in range(4)], final())
MONTH = timedelta(days=30)


@pytest.fixture
def people():
    return make_people()


def age(*runs: Run, days: float = 40) -> None:
    """As if the runs had finished `days` ago."""
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        finished_at=timezone.now() - timedelta(days=days)
    )


def rows(run: Run) -> tuple[int, int, int]:
    return (
        Step.objects.filter(run=run).count(),
        Snapshot.objects.filter(run=run).count(),
        ToolCall.objects.filter(run=run).count(),
    )


def purged(run: Run) -> bool:
    run.refresh_from_db()
    return run.purge_done and not Snapshot.objects.filter(run=run).exists()


def assert_every_state_is_exact(run: Run) -> None:
    for snap in Snapshot.objects.filter(run=run).order_by("seq"):
        assert state_hash(snapshots.load_state(snap)) == snap.hash


def test_a_purge_keeps_the_run_row_its_events_and_its_side_effecting_calls(people):
    run = drive(make_run(SIDE_EFFECTS, user=people["operator"]))
    assert run.status == "succeeded"
    events = list(Event.objects.filter(run=run).values_list("pk", "kind", "payload"))
    side_effects = list(
        ToolCall.objects.filter(run=run, kind__in=("write", "hybrid"))
        .order_by("pk")
        .values_list("pk", "idempotency_key", "status", "step__number")
    )
    assert len(side_effects) == 2 and rows(run) == (4, 8, 4)
    age(run)

    report = retention.purge(MONTH)

    assert (report.runs, report.steps, report.snapshots, report.tool_calls) == (1, 3, 8, 2)
    run.refresh_from_db()
    assert run.purged_at is not None and run.purge_done and run.status == "succeeded"
    # Only the step of the side effects stays, with its calls, as the audit shows them.
    assert rows(run) == (1, 0, 2)
    assert (
        list(
            ToolCall.objects.filter(run=run)
            .order_by("pk")
            .values_list("pk", "idempotency_key", "status", "step__number")
        )
        == side_effects
    )
    assert list(Event.objects.filter(run=run).values_list("pk", "kind", "payload")) == events


def test_runs_finished_within_the_retention_and_active_runs_are_untouched(people):
    recent = drive(make_run(READS))
    age(recent, days=29)
    waiting = drive(
        make_run(
            script(
                calls(
                    {
                        "tool": "ledger_write",
                        "args": {"account": "a", "amount": 1},
                        "approval": True,
                    }
                ),
                final(),
            )
        )
    )
    running = make_run(READS)
    drive(running, max_steps=2)
    running.refresh_from_db()
    assert (waiting.status, running.status) == ("waiting", "running")
    # Even created long ago, and with a finished_at left over: an active run is no candidate.
    long_ago = timezone.now() - timedelta(days=400)
    Run.objects.filter(pk__in=(waiting.pk, running.pk)).update(
        created_at=long_ago, started_at=long_ago, finished_at=long_ago
    )
    before = {r.pk: rows(r) for r in (recent, waiting, running)}

    report = retention.purge(MONTH)

    assert report.runs == 0
    assert {r.pk: rows(r) for r in (recent, waiting, running)} == before
    assert not Run.objects.filter(purged_at__isnull=False).exists()
    drive(running)
    running.refresh_from_db()
    assert running.status == "succeeded"


@pytest.fixture
def family(people):
    """parent → child → grandchild, parent → sibling, and an unrelated run; all old."""
    olga = people["operator"]
    parent = drive(make_run(READS))
    child = drive(services.fork_run(parent, step=2, at="post", user=olga))
    state = snapshots.load(child.pk, 4, "pre")
    state["memory"]["notes"]["edited"] = "by olga"
    grandchild = drive(services.fork_run(child, step=4, at="pre", state=state, user=olga))
    sibling = drive(services.fork_run(parent, step=1, at="pre", user=olga))
    other = drive(make_run(READS))
    runs = {"parent": parent, "child": child, "grandchild": grandchild, "sibling": sibling}
    runs["other"] = other
    assert all(r.status == "succeeded" for r in runs.values())
    age(*runs.values())
    return runs


def test_a_pinned_run_keeps_its_fork_ancestors_and_descendants_and_nothing_else(people, family):
    services.pin_run(family["child"], user=people["operator"], reason="incident #123")
    kept = ("parent", "child", "grandchild")
    before = {name: rows(family[name]) for name in kept}

    report = retention.purge(MONTH)

    assert set(report.run_ids) == {family["sibling"].pk, family["other"].pk}
    for name in kept:
        assert rows(family[name]) == before[name], name
        assert family[name].purged_at is None
    assert purged(family["sibling"]) and purged(family["other"])
    # The kept fork still reads through its kept ancestors' snapshots.
    assert_every_state_is_exact(family["grandchild"])
    assert (
        snapshots.load(family["grandchild"].pk, 4, "pre")["memory"]["notes"]["edited"] == "by olga"
    )
    # A pinned grandchild keeps the whole line above it, but not the line's other branches.
    services.unpin_run(family["child"], user=people["operator"])
    services.pin_run(family["grandchild"], user=people["operator"], reason="incident #124")
    assert retention.purge(MONTH).runs == 0
    assert_every_state_is_exact(family["grandchild"])


def test_unpinned_the_family_goes_leaves_first(people, family):
    pinned = services.pin_run(family["parent"], user=people["admin"], reason="incident #9")
    assert set(retention.purge(MONTH).run_ids) == {family["other"].pk}
    services.unpin_run(pinned, user=people["admin"], reason="closed")

    report = retention.purge(MONTH)

    order = report.run_ids
    assert set(order) == {family[n].pk for n in ("parent", "child", "grandchild", "sibling")}
    assert order.index(family["grandchild"].pk) < order.index(family["child"].pk)
    assert order.index(family["child"].pk) < order.index(family["parent"].pk)
    assert order.index(family["sibling"].pk) < order.index(family["parent"].pk)
    for run in family.values():
        assert purged(run)
        assert run.forked_from_id is None
    # The tombstones keep the lineage.
    family["grandchild"].refresh_from_db()
    assert family["grandchild"].parent_id == family["child"].pk


def test_a_fork_within_the_retention_keeps_its_old_parent(people):
    parent = drive(make_run(READS))
    age(parent, days=90)
    fork = drive(services.fork_run(parent, step=3, at="pre", user=people["operator"]))
    before = rows(parent)

    assert retention.purge(MONTH).runs == 0
    assert rows(parent) == before
    assert_every_state_is_exact(fork)
    age(fork)
    assert retention.purge(MONTH).runs == 2


def test_a_failed_run_whose_hybrid_calls_wait_for_compensation_is_kept(people):
    run = drive(
        make_run(
            script(
                calls({"tool": "reserve", "args": {"sku": "kayak", "qty": 1}}),
                calls({"tool": "fail", "args": {}}),
            )
        )
    )
    assert run.status == "failed"
    # As if the compensation had not happened yet (the reconciler would retry it).
    ToolCall.objects.filter(run=run, tool="reserve").update(status="ok", compensation=None)
    age(run)
    assert retention.purge(MONTH).runs == 0
    ToolCall.objects.filter(run=run, tool="reserve").update(status="compensated")
    assert retention.purge(MONTH).runs == 1


def test_a_dry_run_counts_what_a_purge_deletes_and_changes_nothing(people, family):
    services.pin_run(family["grandchild"], user=people["operator"], reason="incident #5")
    everything = {r.pk: (rows(r), r.purged_at) for r in Run.objects.all()}
    event_count = Event.objects.count()

    dry = retention.purge(MONTH, dry_run=True)

    assert {r.pk: (rows(r), r.purged_at) for r in Run.objects.all()} == everything
    assert Event.objects.count() == event_count
    real = retention.purge(MONTH)
    same = {"dry_run": False, "seconds": 0, "cutoff": ""}
    assert dry.as_dict() | same == real.as_dict() | same
    assert set(dry.run_ids) == set(real.run_ids) == {family["sibling"].pk, family["other"].pk}


@pytest.mark.parametrize("batch", [1, 3, 10, 11, 1000])
def test_every_batch_size_deletes_everything_of_the_run_exactly_once(batch):
    run = drive(make_run(READS))  # 5 steps, 10 snapshots, 4 read calls
    assert rows(run) == (5, 10, 4)
    keep = drive(make_run(READS))
    age(run)

    report = retention.purge(MONTH, batch=batch)

    assert (report.steps, report.snapshots, report.tool_calls) == (5, 10, 4)
    assert rows(run) == (0, 0, 0) and rows(keep) == (5, 10, 4)


def test_a_purge_that_stopped_half_way_is_finished_by_the_next_pass():
    run = drive(make_run(READS))
    age(run)
    # Taken, then the process died after one batch of snapshots.
    Run.objects.filter(pk=run.pk).update(purged_at=timezone.now())
    Snapshot.objects.filter(pk__in=Snapshot.objects.filter(run=run).values("pk")[:3]).delete()
    report = retention.purge(MONTH)
    assert (report.snapshots, report.steps) == (7, 5)
    assert purged(run)


def test_a_pin_needs_a_reason_and_an_existing_run(people):
    run = drive(make_run(READS))
    for bad in ("", "   ", "\n\t", None, 12, "x" * 2001, "nul\x00"):
        with pytest.raises(services.PinError):
            services.pin_run(run, user=people["operator"], reason=bad)
    run.refresh_from_db()
    assert run.pinned_at is None
    assert not Event.objects.filter(kind="run_pinned").exists()
    with pytest.raises(services.ActionError, match="not pinned"):
        services.unpin_run(run, user=people["operator"])


def test_pins_are_audited_and_a_repin_changes_the_reason(people):
    run = drive(make_run(READS))
    olga, ada = people["operator"], people["admin"]
    services.pin_run(run, user=olga, reason="  incident #123 ")
    run.refresh_from_db()
    first_pin = run.pinned_at
    assert (run.pin_reason, run.pinned_by) == ("incident #123", olga)
    services.pin_run(run, user=ada, reason="incident #124")
    run.refresh_from_db()
    assert (run.pinned_at, run.pin_reason, run.pinned_by) == (first_pin, "incident #124", ada)
    services.unpin_run(run, user=olga, reason="closed")
    run.refresh_from_db()
    assert (run.pinned_at, run.pin_reason, run.pinned_by) == (None, "", None)
    events = list(Event.objects.filter(run=run, user__isnull=False).order_by("id"))
    assert [(e.kind, e.actor, e.reason) for e in events] == [
        ("run_pinned", "olga", "incident #123"),
        ("run_pinned", "ada", "incident #124"),
        ("run_unpinned", "olga", "closed"),
    ]


def test_a_purged_run_can_be_neither_pinned_nor_forked(people):
    run = drive(make_run(READS))
    age(run)
    retention.purge(MONTH)
    run.refresh_from_db()
    with pytest.raises(services.ActionError, match="purged"):
        services.pin_run(run, user=people["operator"], reason="too late")
    with pytest.raises(services.ForkError, match="purged"):
        services.fork_run(run, step=1, at="pre", user=people["operator"])
    assert Run.objects.count() == 1


def test_a_run_says_when_it_will_be_purged(settings, people, family):
    settings.AGENTRUN_RETENTION_DAYS = 30
    other = family["other"]
    assert retention.purge_after(other) == other.finished_at + MONTH
    assert retention.kept_by(other) is None
    pinned = services.pin_run(family["child"], user=people["operator"], reason="incident")
    assert retention.purge_after(pinned) is None
    assert retention.kept_by(family["parent"]).pk == pinned.pk
    assert retention.kept_by(family["grandchild"]).pk == pinned.pk
    assert retention.kept_by(family["sibling"]) is None
    settings.AGENTRUN_RETENTION_DAYS = 0
    assert retention.purge_after(other) is None
    assert retention.run_pass() == {"skipped": "retention is off (AGENTRUN_RETENTION_DAYS=0)"}


def test_the_beat_pass_purges_with_the_configured_retention_and_records_it(settings):
    settings.AGENTRUN_RETENTION_DAYS = 30
    old, recent = drive(make_run(READS)), drive(make_run(READS))
    age(old, days=31)
    age(recent, days=29)
    done = retention.run_pass()
    assert (done["runs"], done["complete"]) == (1, True)
    assert purged(old) and not purged(recent)
    event = Event.objects.get(kind="runs_purged")
    assert (event.actor, event.user_id, event.payload["runs"]) == ("retention", None, 1)


def test_the_purge_statements_name_the_models_tables():
    tables = {m._meta.db_table for m in (SearchBlock, ToolCall, Snapshot, Step)}
    named = {w for _, sql in retention.STATEMENTS for w in sql.split() if w.startswith("agentrun_")}
    assert named == tables


def test_durations(db):
    assert retention.parse_duration("30d") == timedelta(days=30)
    assert retention.parse_duration(" 12h") == timedelta(hours=12)
    assert retention.parse_duration("90m") == timedelta(minutes=90)
    for bad in ("", "30", "d", "-3d", "1.5d", "3 weeks", "0d", "30D", "9999999d"):
        with pytest.raises(ValueError):
            retention.parse_duration(bad)


def test_the_event_log_refuses_what_the_purge_never_does(people):
    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's")
    run = drive(make_run(READS))
    age(run)
    retention.purge(MONTH)
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError), transaction.atomic():
        Event.objects.filter(run=run).update(reason="rewritten")
    assert not Event.objects.filter(reason="rewritten").exists()
    assert json.dumps(retention.purge(MONTH).as_dict())


def test_runs_with_no_fork_family_go_in_groups_across_every_boundary(monkeypatch, people, family):
    monkeypatch.setattr(retention, "RUNS_PER_GROUP", 2)
    monkeypatch.setattr(retention, "RUNS_PER_PAGE", 3)
    plain = [drive(make_run(READS)) for _ in range(4)]
    age(*plain)
    services.pin_run(plain[1], user=people["operator"], reason="incident #3")

    report = retention.purge(MONTH, batch=7)

    everything_else = set(Run.objects.exclude(pk=plain[1].pk).values_list("pk", flat=True))
    assert len(everything_else) == 8
    assert set(report.run_ids) == everything_else and len(report.run_ids) == 8
    assert all(purged(run) for run in Run.objects.exclude(pk=plain[1].pk))
    assert Snapshot.objects.count() == 10 and rows(plain[1]) == (5, 10, 4)


def test_a_beat_pass_stops_within_its_budget_and_the_next_one_goes_on(settings, monkeypatch):
    settings.AGENTRUN_RETENTION_DAYS = 30
    settings.AGENTRUN_PURGE_EVERY = 3600
    settings.AGENTRUN_STEP_TIME_LIMIT = 300
    assert retention.pass_budget() == 240  # under the task's time limit, not half an hour
    old = [drive(make_run(READS)) for _ in range(3)]
    age(*old)
    monkeypatch.setattr(retention, "pass_budget", lambda: 0.0)
    monkeypatch.setattr(retention, "RUNS_PER_GROUP", 1)
    first = retention.run_pass()
    assert (first["runs"], first["complete"]) == (0, False)
    monkeypatch.setattr(retention, "pass_budget", lambda: 600.0)
    second = retention.run_pass()
    assert (second["runs"], second["complete"]) == (3, True)
