"""Guarded writes: all or nothing, decided by the guard, on either backend."""

import pytest
from django.conf import settings
from django.db import IntegrityError, connection
from django.utils import timezone

from agentrun.models import Event, Run, Snapshot, Step
from agentrun.store import rawsql
from tests.base import final, make_run, script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durability]


def _guard(run: Run, status: str) -> rawsql.Guarded:
    sql = "UPDATE agentrun_run SET phase = %s WHERE id = %s AND status = %s"
    return rawsql.Guarded(sql, ["guarded", rawsql.prep(Run, "id", run.pk), status])


def _event(run: Run, kind: str) -> dict:
    return {
        "run_id": run.pk,
        "step": 1,
        "kind": kind,
        "actor": "system",
        "user_id": None,
        "reason": "",
        "payload": {"n": 1.5, "big": 10**16, "text": "naïve ☃"},
        "created_at": timezone.now(),
    }


def test_a_guard_that_matches_no_row_writes_nothing():
    run = make_run(script(final()))
    write = _guard(run, "succeeded")  # the run is queued
    write.insert(Event, _event(run, "never"), returning=True)
    write.update(Run, run.pk, {"error": "never"})
    assert write.execute() is None
    run.refresh_from_db()
    assert run.phase != "guarded" and run.error == ""
    assert not Event.objects.filter(kind="never").exists()


@pytest.mark.parametrize("sync", [True, False])
def test_a_guard_that_matches_writes_everything_and_returns_keys_then_selects(sync):
    run = make_run(script(final()))
    step = Step.objects.create(run=run, number=1)
    write = _guard(run, "queued")
    write.insert(Event, _event(run, "first"), returning=True)
    write.update(Step, step.pk, {"decision_count": rawsql.Sql("decision_count + 2")})
    write.select(Step, "SELECT number FROM agentrun_step WHERE id = %s", [step.pk])
    write.select(Step, "SELECT number FROM agentrun_step WHERE id = %s", [-1])
    out = write.execute(sync=sync)
    event = Event.objects.get(kind="first")
    assert out == [event.pk, 1, None]
    assert event.payload == {"n": 1.5, "big": 10**16, "text": "naïve ☃"}
    step.refresh_from_db()
    run.refresh_from_db()
    assert step.decision_count == 2 and run.phase == "guarded"


def test_a_failing_part_rolls_back_the_guard_and_every_other_part():
    run = make_run(script(final()))
    snap = Snapshot.objects.filter(run=run).first() or Snapshot.objects.create(
        run=run, step=1, at="pre", seq=2, kind="ref", keyframe_seq=2, hash="0" * 64, size=0
    )
    dup = {f.attname: getattr(snap, f.attname) for f in Snapshot._meta.concrete_fields}
    dup.pop("id")
    write = _guard(run, "queued")
    write.insert(Event, _event(run, "rolled back"))
    write.insert(Snapshot, dup)  # (run, seq) is unique
    with pytest.raises(IntegrityError):
        write.execute()
    run.refresh_from_db()
    assert run.phase != "guarded"
    assert not Event.objects.filter(kind="rolled back").exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="synchronous_commit is PostgreSQL's")
def test_an_asynchronous_write_leaves_the_connection_committing_synchronously():
    run = make_run(script(final()))
    assert _guard(run, "queued").execute(sync=False) == []
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    run.refresh_from_db()
    assert run.phase == "guarded"


def test_database_urls_prepare_the_hot_path_unless_told_not_to(monkeypatch):
    from agentrun.settings import database_from_url

    monkeypatch.delenv("AGENTRUN_PGBOUNCER", raising=False)

    def options(url: str) -> dict:
        return {k: v for k, v in database_from_url(url)["OPTIONS"].items() if k != "pool"}

    url = "postgres://u:p@db:5432/agentrun"
    assert options(url) == {"prepare_threshold": 5}
    assert options(url + "?prepare_threshold=none") == {"prepare_threshold": None}
    assert options(url + "?prepare_threshold=2&sslmode=require") == {
        "prepare_threshold": 2,
        "sslmode": "require",
    }


def test_behind_pgbouncer_nothing_outlives_a_transaction_on_the_server(monkeypatch):
    from agentrun.settings import database_from_url

    url = "postgres://u:p@db:6432/agentrun"
    monkeypatch.setenv("AGENTRUN_PGBOUNCER", "0")
    db = database_from_url(url)
    assert db["OPTIONS"]["prepare_threshold"] == 5
    assert db["DISABLE_SERVER_SIDE_CURSORS"] is False
    monkeypatch.setenv("AGENTRUN_PGBOUNCER", "1")
    db = database_from_url(url)
    assert db["OPTIONS"]["prepare_threshold"] is None  # no prepared statement
    assert db["DISABLE_SERVER_SIDE_CURSORS"] is True  # no cursor held between transactions


def test_each_process_gets_a_bounded_connection_pool_unless_it_is_turned_off(monkeypatch):
    from agentrun.settings import database_from_url

    url = "postgres://u:p@db:5432/agentrun"
    db = database_from_url(url)
    assert db["OPTIONS"]["pool"]["max_size"] == 9  # and the lease watchdog's own connection
    assert db["CONN_MAX_AGE"] == 0  # pooled connections go back to the pool
    monkeypatch.setenv("DB_POOL_MAX_SIZE", "25")
    assert database_from_url(url)["OPTIONS"]["pool"]["max_size"] == 24
    monkeypatch.setenv("DB_POOL_MAX_SIZE", "0")
    monkeypatch.setenv("DB_CONN_MAX_AGE", "30")
    db = database_from_url(url)
    assert "pool" not in db["OPTIONS"] and db["CONN_MAX_AGE"] == 30


def _prepared_commits_after_six_steps(prepare_threshold: int | None) -> tuple[int, int]:
    """(statements, uses) of the step's commit prepared in the one session of a pool of
    one, after a run of six steps and a final one."""
    from agentrun import engine
    from tests.base import calls

    run = make_run(script(*[calls({"tool": "echo", "args": {"n": i}}) for i in range(6)], final()))
    options = connection.settings_dict["OPTIONS"]
    pool, threshold = options["pool"], options["prepare_threshold"]
    connection.close()
    connection.close_pool()
    options["pool"] = {**pool, "min_size": 1, "max_size": 1}
    options["prepare_threshold"] = prepare_threshold
    try:
        engine.execute_step(run.pk, 1, chain=60)
        run.refresh_from_db()
        assert run.status == "succeeded"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), coalesce(sum(generic_plans + custom_plans), 0)"
                " FROM pg_prepared_statements"
                ' WHERE statement LIKE \'WITH g AS (UPDATE "agentrun_run" SET "next_step"%%\''
            )
            return cursor.fetchone()
    finally:
        connection.close()
        connection.close_pool()
        options["pool"], options["prepare_threshold"] = pool, threshold


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
)
@pytest.mark.skipif(
    settings.AGENTRUN_PGBOUNCER, reason="PgBouncer in transaction mode keeps no prepared statement"
)
def test_the_step_statements_are_prepared_once_and_reused():
    statements, uses = _prepared_commits_after_six_steps(5)
    # Commits of steps that claim the next one share a statement; the last one differs.
    assert 1 <= statements <= 3 and uses >= 6


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
)
def test_a_connection_told_never_to_prepare_sends_the_step_statements_unprepared():
    # What PgBouncer in transaction mode needs: the next statement of the session may
    # run on another server connection, where a prepared statement does not exist.
    assert _prepared_commits_after_six_steps(None) == (0, 0)
