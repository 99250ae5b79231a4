"""A least-privilege PostgreSQL role for the app (`manage.py dbroles`).

Migrations run as the role that owns the tables. The web and worker processes connect
as an app role that owns nothing: it reads and writes the app's tables, but may only
append to the event log and read it (and read the chains' heads, which the log's
trigger writes as the owner). Since only a table's owner may drop or disable
its triggers, the app can neither change the log (no UPDATE, DELETE or TRUNCATE
privilege) nor switch off the triggers that refuse those to everyone else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import connection, transaction
from psycopg import sql

from agentrun.models import AuditHead, Event

EVENTS = Event._meta.db_table
# The chains' heads: written only by the trigger that chains the log, as the owner.
HEADS = AuditHead._meta.db_table
# Written by `migrate` only, which runs as the owner; the app reads it (pending migrations).
READ_ONLY = ("django_migrations",)
# Lower-case, unquoted-identifier names only: the same name then works in DATABASE_URL,
# psql and pg_hba.conf without quoting.
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class RoleError(ValueError):
    """The role can't be made a least-privilege app role (bad name, or too powerful)."""


@dataclass
class Plan:
    role: str
    exists: bool
    owner: str
    statements: list[sql.Composable]


def plan_app_role(role: str) -> Plan:
    """The statements that create (or update) `role` and grant it exactly what the app needs.

    Run again after every `migrate`: the grants are reset to this list each time, so
    new tables are covered and nothing granted by hand on the app's tables stays.
    """
    if not ROLE_NAME.fullmatch(role):
        raise RoleError(f"role name {role!r}: use lower-case letters, digits and _")
    if connection.vendor != "postgresql":
        raise RoleError("database roles are PostgreSQL's; the embedded SQLite has none")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_database(), current_schema(), pg_get_userbyid(relowner)"
            " FROM pg_class WHERE oid = %s::regclass",
            [EVENTS],
        )
        database, schema, owner = cursor.fetchone()
        cursor.execute(
            "SELECT rolsuper, pg_has_role(rolname, %s, 'MEMBER') FROM pg_roles WHERE rolname = %s",
            [owner, role],
        )
        found = cursor.fetchone()
    if found and found[0]:
        raise RoleError(f"{role} is a superuser: it bypasses every privilege check")
    if found and found[1]:
        raise RoleError(
            f"{role} owns the tables (or is a member of {owner}, their owner): "
            "the app role must be another role"
        )
    tables = sorted(connection.introspection.django_table_names(only_existing=True))
    tables += [t for t in READ_ONLY if t in connection.introspection.table_names()]
    sequences = sorted({s["name"] for s in connection.introspection.sequence_list()})
    return Plan(role, bool(found), owner, _statements(role, database, schema, tables, sequences))


def _statements(
    role: str, database: str, schema: str, tables: list[str], sequences: list[str]
) -> list[sql.Composable]:
    r = sql.Identifier(role)

    def names(items: list[str]) -> sql.Composable:
        return sql.SQL(", ").join(sql.Identifier(schema, t) for t in items)

    read_write = [t for t in tables if t not in (EVENTS, HEADS) and t not in READ_ONLY]
    read_only = [t for t in tables if t in READ_ONLY or t == HEADS]
    out: list[sql.Composable] = [
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), r),
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), r),
        sql.SQL("REVOKE ALL ON TABLE {} FROM {}").format(names(tables), r),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO {}").format(
            names(read_write), r
        ),
        # The event log: appended to and read, never changed.
        sql.SQL("GRANT SELECT, INSERT ON TABLE {} TO {}").format(names([EVENTS]), r),
    ]
    if read_only:
        out.append(sql.SQL("GRANT SELECT ON TABLE {} TO {}").format(names(read_only), r))
    if sequences:
        out.append(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(names(sequences), r))
    return out


def role_statements(plan: Plan, password: str | None) -> list[sql.Composable]:
    r = sql.Identifier(plan.role)
    verb = "ALTER ROLE {} LOGIN" if plan.exists else "CREATE ROLE {} LOGIN"
    out: list[sql.Composable] = [sql.SQL(verb).format(r)]
    if password is not None:
        out.append(sql.SQL("ALTER ROLE {} PASSWORD {}").format(r, sql.Literal(password)))
    return out


def apply(plan: Plan, password: str | None) -> None:
    """Create or update the role and reset its grants, in one transaction."""
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in role_statements(plan, password) + plan.statements:
            cursor.execute(as_text(statement))


def as_text(statement: sql.Composable) -> str:
    return statement.as_string(connection.connection)
