"""`manage.py dbroles`: the app connects as a role that can append to the event log and
read it, but can neither change it nor switch off the triggers that guard it.

Roles belong to the whole PostgreSQL cluster, which other test runs share: each test
uses a role named after its process and drops it afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection

from agentrun.audit.events import record_event
from agentrun.models import Event

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="roles are PostgreSQL's"
)

PASSWORD = "app role password"


def drop_role(name: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name])
        if cur.fetchone():
            cur.execute(f'DROP OWNED BY "{name}"')  # its grants in this database
            cur.execute(f'DROP ROLE "{name}"')


@pytest.fixture
def app_role(monkeypatch):
    name = f"agentrun_test_app_{os.getpid()}"
    drop_role(name)  # left over by a run that was killed
    monkeypatch.setenv("AGENTRUN_TEST_APP_PASSWORD", PASSWORD)
    yield name
    drop_role(name)


def dbroles(*args: str) -> str:
    out = StringIO()
    call_command("dbroles", *args, stdout=out)
    return out.getvalue()


def create(role: str) -> str:
    return dbroles("--app-role", role, "--password-env", "AGENTRUN_TEST_APP_PASSWORD")


def connect_as(role: str) -> psycopg.Connection:
    """A connection to the test database as the app connects: logged in as its role."""
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        dbname=db["NAME"],
        user=role,
        password=PASSWORD,
        autocommit=True,
    )


TAMPERING = [
    "UPDATE agentrun_event SET kind = 'forged'",
    "DELETE FROM agentrun_event",
    "TRUNCATE agentrun_event",
    "ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_append_only",
    "ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_no_truncate",
    "ALTER TABLE agentrun_event DISABLE TRIGGER ALL",
    "DROP TRIGGER agentrun_event_append_only ON agentrun_event",
    "DROP TRIGGER agentrun_event_no_truncate ON agentrun_event",
    "DROP FUNCTION agentrun_event_append_only() CASCADE",
    "DROP TABLE agentrun_event",
    "ALTER TABLE agentrun_event RENAME TO agentrun_event_old",
]


@postgresql_only
def test_the_app_role_appends_and_reads_events_but_cannot_change_them_or_their_triggers(
    app_role,
):
    record_event("note", payload={"n": 1})
    assert create(app_role).startswith(f"created role {app_role}")

    with connect_as(app_role) as app:
        app.execute(
            "INSERT INTO agentrun_event (kind, actor, reason, payload, created_at)"
            " VALUES ('appended', 'app', '', '{}', now())"
        )
        assert app.execute("SELECT count(*) FROM agentrun_event").fetchone() == (2,)
        for statement in TAMPERING:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)

    assert sorted(Event.objects.values_list("kind", flat=True)) == ["appended", "note"]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tgname, tgenabled FROM pg_trigger"
            " WHERE tgrelid = 'agentrun_event'::regclass AND NOT tgisinternal ORDER BY tgname"
        )
        triggers = cur.fetchall()
    assert triggers == [
        ("agentrun_event_append_only", "O"),
        ("agentrun_event_chain", "O"),
        ("agentrun_event_no_truncate", "O"),
    ]


@postgresql_only
def test_the_app_role_can_neither_back_date_nor_forge_an_event_nor_move_a_chain(app_role):
    from agentrun.audit import chain

    record_event("note")
    create(app_role)
    with connect_as(app_role) as app:
        app.execute(
            "INSERT INTO agentrun_event (kind, actor, user_id, reason, payload, created_at,"
            " stream, seq, prev_hash, hash, db_role)"
            " VALUES ('backdated', 'olga', 1, '', '{}', '2001-02-03T04:05:06Z',"
            " 'operator', 99, 'x', 'y', 'postgres')"
        )
        with app.transaction():
            app.execute("SELECT set_config('agentrun.actor', 'olga', true)")
            app.execute(
                "INSERT INTO agentrun_event (kind, actor, reason, payload, created_at)"
                " VALUES ('as_olga', 'system', '', '{}', now() - interval '1 day')"
            )
        now = app.execute("SELECT now()").fetchone()[0]
        for statement in [
            "UPDATE agentrun_audithead SET seq = 0",
            "INSERT INTO agentrun_audithead (stream, seq, hash) VALUES ('forged', 1, '')",
            "DELETE FROM agentrun_audithead",
            "ALTER TABLE agentrun_event DISABLE TRIGGER agentrun_event_chain",
            "DROP FUNCTION agentrun_event_chain() CASCADE",
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)

    backdated = Event.objects.get(kind="backdated")
    assert abs((backdated.created_at - now).total_seconds()) < 60
    assert (backdated.actor, backdated.user_id, backdated.db_role) == ("system", None, app_role)
    assert (backdated.stream, backdated.seq) == ("operator", 2)
    # The actor is the one the transaction named; the time is still the database's.
    as_olga = Event.objects.get(kind="as_olga")
    assert (as_olga.actor, as_olga.db_role) == ("olga", app_role)
    assert as_olga.created_at > backdated.created_at
    assert chain.verify().ok


@postgresql_only
def test_running_it_again_updates_the_role_and_resets_its_grants(app_role):
    create(app_role)
    with connection.cursor() as cur:  # granted by hand since
        cur.execute(f'GRANT UPDATE, DELETE, TRUNCATE ON agentrun_event TO "{app_role}"')

    assert create(app_role).startswith(f"updated role {app_role}")

    with connect_as(app_role) as app:
        for statement in TAMPERING[:3]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)


@postgresql_only
def test_the_app_works_connected_as_the_app_role(app_role):
    """A run with a side effect, an approval, a cancel and its compensation, as the app role."""
    create(app_role)
    db = connection.settings_dict
    env = {
        "PATH": os.environ["PATH"],
        "DATABASE_URL": f"postgres://{app_role}:{quote(PASSWORD)}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "AGENTRUN_VAR_DIR": str(settings.VAR_DIR),
        "AGENTRUN_ENQUEUE": "0",
    }
    code = """
import json
from django.db import connection
from agentrun.lifecycle import services
from agentrun.security.roles import create_user
from tests.base import calls, drive, final, make_run, script

olga = create_user("olga", "operator", "pw")
paid = drive(make_run(script(
    calls({"tool": "reserve", "args": {"sku": "w", "qty": 1}}, {"tool": "ledger_write", "args": {"account": "a", "amount": 1}}),
    calls({"tool": "echo", "args": {}, "approval": True}),
    final(),
)))
services.decide_approval(paid, user=olga, decision="approve")
paid = drive(paid)
stopped = drive(make_run(script(
    calls({"tool": "reserve", "args": {"sku": "w", "qty": 1}}),
    calls({"tool": "echo", "args": {}, "approval": True}),
    final(),
)))
services.cancel_run(stopped, user=olga, reason="stop")
with connection.cursor() as cur:
    cur.execute("SELECT current_user")
    (user,) = cur.fetchone()
print(json.dumps([user, paid.status, stopped.status, stopped.tool_calls.get(tool="reserve").status]))
"""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome == [app_role, "succeeded", "cancelled", "compensated"]


@postgresql_only
def test_print_shows_the_grants_without_running_them_or_the_password(app_role):
    out = dbroles("--app-role", app_role, "--password-env", "AGENTRUN_TEST_APP_PASSWORD", "--print")

    assert f'CREATE ROLE "{app_role}" LOGIN;' in out
    assert f'GRANT SELECT, INSERT ON TABLE "public"."agentrun_event" TO "{app_role}";' in out
    assert PASSWORD not in out
    with connection.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [app_role])
        assert cur.fetchone() is None


@postgresql_only
@pytest.mark.parametrize(
    ("make_role", "why"),
    [
        ("CREATE ROLE {role} SUPERUSER", "is a superuser: it bypasses every privilege check"),
        ("CREATE ROLE {role}; GRANT {owner} TO {role}", "owns the tables (or is a member of"),
    ],
)
def test_it_refuses_a_role_that_bypasses_privileges_or_owns_the_tables(app_role, make_role, why):
    owner = connection.settings_dict["USER"]  # who ran the migrations
    with connection.cursor() as cur:
        cur.execute(make_role.format(role=f'"{app_role}"', owner=f'"{owner}"'))

    with pytest.raises(CommandError, match=re.escape(why)):
        dbroles("--app-role", app_role)


@postgresql_only
def test_it_refuses_to_make_the_tables_owner_the_app_role():
    owner = connection.settings_dict["USER"]
    with pytest.raises(CommandError, match="is a superuser|owns the tables"):
        dbroles("--app-role", owner)


@postgresql_only
def test_it_refuses_an_empty_password_variable(app_role, monkeypatch):
    monkeypatch.setenv("AGENTRUN_TEST_APP_PASSWORD", "")
    with pytest.raises(CommandError, match="is empty or not set"):
        create(app_role)


@pytest.mark.skipif(connection.vendor == "postgresql", reason="the embedded database's answer")
def test_on_the_embedded_database_it_says_roles_are_postgresqls():
    with pytest.raises(CommandError, match="database roles are PostgreSQL's"):
        dbroles("--app-role", "agentrun_app")
