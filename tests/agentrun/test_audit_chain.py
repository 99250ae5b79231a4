"""The event log proves itself: each event is chained to the one before it in its stream,
by the database, and `verifyaudit` names the first link that does not hold."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import timedelta
from importlib import import_module
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client
from django.utils import timezone

from agentrun.audit import chain
from agentrun.audit.events import record_event
from agentrun.lifecycle import retention, services
from agentrun.models import ApiToken, AuditHead, Event, Run
from tests.base import as_owner, calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db(transaction=True)
postgresql = connection.vendor == "postgresql"


def verifyaudit() -> tuple[int, str]:
    """The command's exit code and what it said."""
    out, err = StringIO(), StringIO()
    try:
        call_command("verifyaudit", stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), err.getvalue()
    return 0, out.getvalue()


def a_history() -> tuple[Run, dict]:
    """Two runs driven to their end, operator actions on them, and one on no run."""
    people = make_people()
    done = drive(make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final())))
    for n in range(3):
        record_event("note", run=done, step=1, payload={"n": n, "text": "line\nbreak"})
    cancelled = make_run(script(calls({"tool": "echo", "args": {"n": 1}}), final()))
    services.cancel_run(cancelled, user=people["operator"], reason="not needed")
    record_event("note", user=people["operator"], reason="a remark", payload={"é": [1, 2.5]})
    return done, people


def test_an_untouched_log_verifies():
    a_history()
    code, said = verifyaudit()
    assert code == 0, said
    assert said.startswith("verified: ")
    report = chain.verify()
    assert report.ok and report.events == Event.objects.count() >= 4
    # One stream per run for the system, one for operators.
    streams = set(Event.objects.values_list("stream", flat=True))
    assert chain.OPERATOR in streams and any(s.startswith("run:") for s in streams)
    assert set(AuditHead.objects.values_list("stream", flat=True)) == streams


def test_each_event_is_linked_to_the_one_before_it_in_its_stream():
    run, _ = a_history()
    record_event("note", run=run, payload={"n": 1})
    record_event("note", run=run, payload={"n": 2})
    events = list(Event.objects.filter(stream=chain.run_stream(run.pk)).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].prev_hash == ""
    for before, after in zip(events, events[1:], strict=False):
        assert after.prev_hash == before.hash
    head = AuditHead.objects.get(stream=chain.run_stream(run.pk))
    assert (head.seq, head.hash) == (events[-1].seq, events[-1].hash)


def test_an_event_edited_past_the_triggers_is_named():
    run, _ = a_history()
    target = Event.objects.filter(run=run).order_by("seq")[1]
    assert verifyaudit()[0] == 0

    as_owner("UPDATE agentrun_event SET reason = %s WHERE id = %s", ["edited", target.pk])

    code, said = verifyaudit()
    assert code == 1
    assert f"event {target.pk} (stream run:{run.pk}, position 2)" in said
    assert "do not hash to its stored hash" in said
    report = chain.verify()
    assert report.broken is not None and report.broken.event_id == str(target.pk)


def test_an_event_rehashed_by_hand_breaks_the_link_to_the_next():
    run, _ = a_history()
    first, second = Event.objects.filter(run=run).order_by("seq")[:2]
    values = next(r for r in chain.records(Event.objects.filter(pk=first.pk)))
    values["kind"] = "forged"
    forged = chain.digest([values[n] for n in chain.FIELDS])
    as_owner(
        "UPDATE agentrun_event SET kind = 'forged', hash = %s WHERE id = %s", [forged, first.pk]
    )

    code, said = verifyaudit()
    assert code == 1
    assert f"event {second.pk} " in said and f"not the hash of event {first.pk}" in said


def test_a_deleted_event_is_named_by_the_gap_it_leaves():
    run, _ = a_history()
    events = list(Event.objects.filter(run=run).order_by("seq"))
    as_owner("DELETE FROM agentrun_event WHERE id = %s", [events[1].pk])

    report = chain.verify()
    assert report.broken.event_id == str(events[2].pk)
    assert "position 2 of its stream is missing" in report.broken.what


def test_a_chain_cut_at_its_end_is_named_by_its_head():
    run, _ = a_history()
    events = list(Event.objects.filter(run=run).order_by("seq"))
    as_owner("DELETE FROM agentrun_event WHERE id = %s", [events[-1].pk])

    report = chain.verify()
    assert report.broken.event_id == str(events[-2].pk)
    assert f"head is at position {events[-1].seq}" in report.broken.what


def test_an_event_inserted_past_the_chain_is_named():
    a_history()
    with connection.cursor() as cursor:
        if postgresql:
            with transaction.atomic():
                cursor.execute("ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_chain")
                cursor.execute(
                    "INSERT INTO agentrun_event (kind, actor, reason, payload, created_at)"
                    " VALUES ('forged', 'alice', '', '{}', now()) RETURNING id"
                )
                (forged,) = cursor.fetchone()
                cursor.execute("ALTER TABLE agentrun_event ENABLE TRIGGER agentrun_event_chain")
        else:
            cursor.execute("DROP TRIGGER agentrun_event_chain")
            try:
                cursor.execute(
                    "INSERT INTO agentrun_event (kind, actor, reason, payload, created_at)"
                    " VALUES ('forged', 'alice', '', '{}', '2026-01-01 00:00:00') RETURNING id"
                )
                (forged,) = cursor.fetchone()
            finally:
                migration = import_module("agentrun.migrations.0021_audit_chain")
                cursor.execute(migration.SQLITE_FORWARD)
    report = chain.verify()
    assert report.broken.event_id == str(forged)
    assert "in no chain" in report.broken.what


def test_concurrent_appends_keep_one_chain():
    run = make_run(script(final()))
    people = make_people()
    errors: list[BaseException] = []
    per_thread = 15

    def append(n: int) -> None:
        try:
            for i in range(per_thread):
                with transaction.atomic():
                    record_event("note", run=run, payload={"t": n, "i": i})
                    record_event("note", user=people["operator"], payload={"t": n, "i": i})
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not errors, errors
    ops = list(Event.objects.filter(stream=chain.OPERATOR).order_by("seq"))
    assert [e.seq for e in ops] == list(range(1, 4 * per_thread + 1))
    in_run = list(Event.objects.filter(stream=chain.run_stream(run.pk)).order_by("seq"))
    assert [e.seq for e in in_run] == list(range(1, len(in_run) + 1))
    assert sum(e.kind == "note" for e in in_run) == 4 * per_thread
    assert chain.verify().ok


def test_a_purge_keeps_each_run_chains_head_in_the_operator_stream():
    run, _ = a_history()
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=40))
    head = AuditHead.objects.get(stream=chain.run_stream(run.pk))

    report = retention.purge(timedelta(days=30))
    retention.record(report, actor="manage.py purge")

    assert run.pk in report.run_ids
    summary = Event.objects.get(kind=chain.PURGE_KIND)
    assert summary.stream == chain.OPERATOR
    assert summary.payload["chains"][str(run.pk)] == {"seq": head.seq, "hash": head.hash}
    code, said = verifyaudit()
    assert code == 0, said
    assert "1 purged run chain(s) checked" in said

    # The run's chain, cut off at its end and its head moved back: only the summary knows.
    last = Event.objects.get(stream=chain.run_stream(run.pk), seq=head.seq)
    as_owner("DELETE FROM agentrun_event WHERE id = %s", [last.pk])
    as_owner(
        "UPDATE agentrun_audithead SET seq = seq - 1, hash = %s WHERE stream = %s",
        [last.prev_hash, head.stream],
    )
    report = chain.verify()
    assert report.broken.event_id == str(summary.pk)
    assert f"summary of run {run.pk}" in report.broken.what


def test_the_report_as_json():
    a_history()
    out = StringIO()
    call_command("verifyaudit", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ok"] is True and report["broken"] is None and report["events"] >= 4


def test_the_api_verifies_the_chains():
    _, people = a_history()
    viewer = Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['viewer'])}")
    answer = viewer.get("/api/audit/verify")
    assert answer.status_code == 200
    assert answer.json()["ok"] is True


@pytest.mark.skipif(not postgresql, reason="the database's clock and session are PostgreSQL's")
def test_the_database_stamps_the_time_and_takes_the_actor_from_the_transaction():
    people = make_people()
    before = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO agentrun_event (kind, actor, user_id, reason, payload, created_at)"
            " VALUES ('claimed', 'alice', %s, '', '{}', '2000-01-01T00:00:00Z')",
            [people["operator"].pk],
        )
    event = record_event("note", user=people["operator"], reason="mine")
    forged, real = Event.objects.order_by("id")
    assert forged.created_at >= before and forged.created_at.year != 2000
    assert (forged.actor, forged.user_id, forged.db_role) == ("system", None, "postgres")
    assert (real.actor, real.user_id) == (people["operator"].username, people["operator"].pk)
    assert real.pk == event.pk
    # The settings were for that insert only.
    record_event("note")
    assert Event.objects.order_by("-id").first().actor == "system"


def test_the_badge_checks_new_events_alone_and_every_event_again_later():
    from django.core.cache import cache

    run, people = a_history()
    cache.clear()
    first = chain.status()  # no verification yet: a full one
    assert first.ok and first.full_at == first.checked_at
    assert chain.status() is not None and cache.get(chain.CACHE_KEY).checked_at == first.checked_at

    old = Event.objects.filter(run=run).order_by("seq").first()
    as_owner("UPDATE agentrun_event SET reason = 'edited' WHERE id = %s", [old.pk])
    new = record_event("note", run=run, payload={"after": "the check"})
    aged = cache.get(chain.CACHE_KEY)
    aged.checked_at -= timedelta(seconds=chain.CACHE_SECONDS)
    cache.set(chain.CACHE_KEY, aged)

    # A minute on: only what was written since is checked, linked to what was there.
    since = chain.status()
    assert since.ok and since.events == first.events + 1 and since.max_id == new.pk
    assert since.full_at == first.full_at

    as_owner("UPDATE agentrun_event SET reason = 'edited too' WHERE id = %s", [new.pk])
    newer = record_event("note", run=run)
    aged = cache.get(chain.CACHE_KEY)
    aged.max_id = new.pk - 1  # as if the last check had stopped before it
    aged.checked_at -= timedelta(seconds=chain.CACHE_SECONDS)
    cache.set(chain.CACHE_KEY, aged)
    assert chain.status().broken.event_id == str(new.pk)
    assert newer.pk > new.pk

    # After a break, and every FULL_SECONDS, everything is checked again: the old edit too.
    report = chain.status()
    assert report.full_at == report.checked_at
    assert report.broken.event_id == str(old.pk)


def test_verifying_while_events_are_appended_finds_nothing_wrong():
    run = make_run(script(final()))
    stop = threading.Event()
    errors: list[BaseException] = []

    def append() -> None:
        try:
            n = 0
            while not stop.is_set():
                record_event("note", run=run, payload={"n": n})
                record_event("note", payload={"n": n})
                n += 1
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        reports = [chain.verify() for _ in range(15)]
        # On a busy host the writer may not have committed yet: verify until it has.
        deadline = time.monotonic() + 30
        while reports[-1].events <= reports[0].events and time.monotonic() < deadline:
            reports.append(chain.verify())
    finally:
        stop.set()
        writer.join()
    assert not errors, errors
    assert [r.broken for r in reports] == [None] * len(reports)
    assert reports[-1].events > reports[0].events


APPENDER = """
from agentrun.audit.events import record_event
from agentrun.models import Run
from django.contrib.auth import get_user_model
run, olga = Run.objects.get(pk="{run}"), get_user_model().objects.get(username="olga")
for i in range({n}):
    record_event("note", run=run, payload={{"i": i}})
    record_event("note", user=olga, payload={{"i": i}})
"""


def test_concurrent_appends_from_processes_keep_one_chain():
    from tests.workers import ROOT, worker_env

    run = make_run(script(final()))
    make_people()
    before = Event.objects.filter(stream=chain.run_stream(run.pk)).count()
    n, processes = 20, 3
    children = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", APPENDER.format(run=run.pk, n=n)],
            cwd=ROOT,
            env=worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(processes)
    ]
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0, out

    in_run = list(
        Event.objects.filter(stream=chain.run_stream(run.pk)).values_list("seq", flat=True)
    )
    assert sorted(in_run) == list(range(1, before + n * processes + 1))
    ops = list(Event.objects.filter(stream=chain.OPERATOR).values_list("seq", flat=True))
    assert sorted(ops) == list(range(1, n * processes + 1))
    assert chain.verify().ok
