"""Raw SQL for the step's hot path: few statements, each doing a lot.

The ORM spends more CPU building a statement than PostgreSQL spends running
it, and every statement and every transaction boundary is a round trip. The
engine's claim, decision and commit are each one `Guarded` write: an UPDATE
of the run row that must match exactly one row (the lease or the
compare-and-set), plus inserts and updates that take effect only if it did.

On PostgreSQL that is one statement (data-modifying CTEs conditioned on the
guard), so a commit is one round trip. Statements are sent with server-side
parameters, so psycopg prepares each shape after a few uses and the server
skips parsing and planning it. On SQLite (in process, no round trips) it is a
short transaction: the guard first, the rest only if it matched.

Values go through each field's own get_db_prep_save and come back through its
converters, so custom fields behave exactly as through the ORM.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, models, transaction
from django.db.backends.utils import CursorWrapper


@dataclass(frozen=True)
class Sql:
    """A raw SQL expression as a value, e.g. Sql("decision_count + 1"), or with
    parameters for its %s placeholders, e.g. Sql("tokens_in + %s", (812,)).

    A value that changes from one statement to the next must be a parameter: the text
    is the statement's shape, which its SQL is cached and prepared by (a count written
    into the text made a new statement, cached forever, at every step)."""

    text: str
    params: tuple[Any, ...] = ()


def db() -> Any:
    """The default connection itself (not the thread-local proxy: this is a hot path)."""
    return connections[DEFAULT_DB_ALIAS]


@cache
def table(model: type[models.Model]) -> str:
    return db().ops.quote_name(model._meta.db_table)


@cache
def _field(model: type[models.Model], name: str) -> models.Field:
    if name == "pk":
        return model._meta.pk  # type: ignore[return-value]
    return model._meta.get_field(name)  # type: ignore[return-value]


@cache
def column(model: type[models.Model], name: str) -> str:
    return db().ops.quote_name(_field(model, name).column)


@cache
def slot(model: type[models.Model], name: str) -> str:
    """The placeholder for a value of this field (typed on PostgreSQL)."""
    conn = db()
    if conn.vendor != "postgresql":
        return "%s"
    return "%s::" + _field(model, name).cast_db_type(conn)


@cache
def _passes(model: type[models.Model], name: str) -> tuple[type, ...]:
    """The Python types this field sends to PostgreSQL unchanged (a hot-path shortcut)."""
    conn = db()
    if conn.vendor != "postgresql":
        return ()
    f = _field(model, name)
    internal = f.get_internal_type()
    if internal in ("CharField", "TextField"):
        return (str,)
    if internal in ("IntegerField", "BigIntegerField", "PositiveIntegerField", "FloatField"):
        return (int, float)
    if internal == "BooleanField":
        return (bool,)
    if internal == "DateTimeField" and settings.USE_TZ:
        return (datetime,)  # aware: the engine's come from timezone.now()
    if internal == "UUIDField" or (
        internal == "ForeignKey" and f.target_field.get_internal_type() == "UUIDField"  # type: ignore[attr-defined]
    ):
        return (uuid.UUID,)
    return ()


@cache
def _nullable(model: type[models.Model], name: str) -> bool:
    """None is SQL NULL for this field as it is (not, say, JSON null)."""
    f = _field(model, name)
    return f.null or f.get_internal_type() == "JSONField"  # JSONField saves None as NULL


def prep(model: type[models.Model], name: str, value: Any, conn: Any = None) -> Any:
    if type(value) in _passes(model, name) or (value is None and _nullable(model, name)):
        return value
    return _field(model, name).get_db_prep_save(value, conn or db())


def insert_fields(obj: models.Model) -> dict[str, Any]:
    """Every concrete field of an unsaved object but an automatic primary key."""
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if not (f.primary_key and getattr(obj, f.attname) is None)
    }


@cache
def _concrete(model: type[models.Model]) -> tuple[tuple[str, models.Field], ...]:
    return tuple((f.attname, f) for f in model._meta.concrete_fields)


def instance(model: type[models.Model], values: dict[str, Any]) -> Any:
    """A new, unsaved instance from attname values, other fields at their defaults.

    Built as Model.from_db builds one (positional, several times faster than keyword
    arguments); the caller inserts it and then marks it saved.
    """
    fields = _concrete(model)
    obj = model.from_db(
        DEFAULT_DB_ALIAS,
        [name for name, _ in fields],
        [values[name] if name in values else f.get_default() for name, f in fields],
    )
    obj._state.adding = True
    return obj


@cache
def _converters(model: type[models.Model], names: tuple[str, ...]) -> list[Any]:
    conn = db()
    out = []
    for name in names:
        f = _field(model, name)
        col = f.get_col(model._meta.db_table)
        out.append((conn.ops.get_db_converters(col) + f.get_db_converters(conn), col))
    return out


def from_row(model: type[models.Model], names: tuple[str, ...], values: Any) -> Any:
    """A model instance from raw column values, converted as the ORM would."""
    conn = db()
    converted = []
    for value, (convs, col) in zip(values, _converters(model, names), strict=True):
        for conv in convs:
            value = conv(value, col, conn)
        converted.append(value)
    return model.from_db(conn.alias, list(names), converted)


def convert(model: type[models.Model], name: str, value: Any) -> Any:
    """One raw column value, converted as the ORM would."""
    conn = db()
    [(convs, col)] = _converters(model, (name,))
    for conv in convs:
        value = conv(value, col, conn)
    return value


@cache
def attnames(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in model._meta.concrete_fields)


@cache
def select_list(model: type[models.Model]) -> str:
    return ", ".join(column(model, n) for n in attnames(model))


@dataclass
class _Part:
    kind: str  # insert | update | select
    model: type[models.Model]
    values: dict[str, Any]
    pk: Any = None
    returning: bool = False
    sql: str = ""  # a select's text; its values are its parameters, in order

    def shape(self) -> tuple[Any, ...]:
        """What the SQL text of this part depends on (raw values are part of the text)."""
        return (
            self.kind,
            self.model,
            self.returning,
            self.sql,
            tuple((n, v.text if isinstance(v, Sql) else None) for n, v in self.values.items()),
        )

    def params(self, conn: Any = None) -> list[Any]:
        if self.kind == "select":
            return list(self.values.values())
        model = self.model
        out: list[Any] = []
        for n, v in self.values.items():
            if isinstance(v, Sql):
                out += v.params
            else:
                out.append(prep(model, n, v, conn))
        if self.kind == "update":
            out.append(prep(model, "pk", self.pk, conn))
        return out


def _sets(part: _Part) -> str:
    return ", ".join(
        f"{column(part.model, n)} = {v.text if isinstance(v, Sql) else slot(part.model, n)}"
        for n, v in part.values.items()
    )


def _values(part: _Part) -> tuple[str, str]:
    cols = ", ".join(column(part.model, n) for n in part.values)
    phs = ", ".join(
        v.text if isinstance(v, Sql) else slot(part.model, n) for n, v in part.values.items()
    )
    return cols, phs


# Referenced from a statement, this makes the commit of the transaction it runs in
# (in autocommit: the statement's own) asynchronous, and only that one.
ASYNC_COMMIT = "cfg AS (SELECT set_config('synchronous_commit', 'off', true) AS v)"


def _pg_statement(guard: str, parts: list[_Part], sync: bool) -> str:
    ctes = [f"g AS ({guard} RETURNING 1)"]
    outs = ["(SELECT count(*) FROM g)"]
    for i, part in enumerate(parts):
        name, tbl, pk = f"c{i}", table(part.model), column(part.model, "pk")
        if part.kind == "select":
            continue
        if part.kind == "insert":
            cols, phs = _values(part)
            ret = f" RETURNING {pk}" if part.returning else ""
            ctes.append(f"{name} AS (INSERT INTO {tbl} ({cols}) SELECT {phs} FROM g{ret})")
            if part.returning:
                outs.append(f"(SELECT * FROM {name})")
        else:
            ctes.append(
                f"{name} AS (UPDATE {tbl} SET {_sets(part)} WHERE {pk} = %s"
                " AND EXISTS (SELECT 1 FROM g))"
            )
    # Selects last: their values follow the returned keys, their parameters all others.
    outs += [f"({part.sql})" for part in parts if part.kind == "select"]
    if not sync:
        ctes.insert(0, ASYNC_COMMIT)
        outs.append("(SELECT v FROM cfg)")
    return f"WITH {', '.join(ctes)} SELECT {', '.join(outs)}"


@dataclass
class Guarded:
    """One guarded write: `guard` is `UPDATE <run table> SET ... WHERE ...` (no RETURNING)."""

    guard: str
    guard_params: list[Any]
    parts: list[_Part] = field(default_factory=list)

    def insert(
        self, model: type[models.Model], values: dict[str, Any], *, returning: bool = False
    ) -> None:
        self.parts.append(_Part("insert", model, values, returning=returning))

    def update(self, model: type[models.Model], pk: Any, values: dict[str, Any]) -> None:
        self.parts.append(_Part("update", model, values, pk=pk))

    def select(self, model: type[models.Model], sql: str, params: list[Any]) -> None:
        """A scalar query read along (its value follows the returned keys; None if no row).

        It sees the database as it was before this write.
        """
        values = {str(i): p for i, p in enumerate(params)}
        self.parts.append(_Part("select", model, values, sql=sql))

    def execute(self, *, sync: bool = True) -> list[Any] | None:
        """Run it; None if the guard matched no row (then nothing was written).

        Returns the primary keys of the inserts asked `returning=True`, in order,
        then the values of the selects. With sync=False on PostgreSQL its commit
        does not wait for the WAL flush: the write survives any crash but the
        database server's own, and the next synchronous commit flushes it too.
        """
        conn = db()
        if conn.vendor == "postgresql":
            return self._execute_pg(sync, conn)
        return self._execute_sequential()

    def _execute_pg(self, sync: bool, conn: Any) -> list[Any] | None:
        sql = _statement(self.guard, self.parts, sync)
        params = list(self.guard_params)
        for part in self.parts:
            if part.kind != "select":
                params += part.params(conn)
        for part in self.parts:  # the selects come last in the statement's text
            if part.kind == "select":
                params += part.params()
        row = run_statement(sql, params, conn)
        if row is None or row[0] != 1:
            return None
        return list(row[1:] if sync else row[1:-1])

    def _execute_sequential(self) -> list[Any] | None:
        returned: list[Any] = []
        conn = db()
        with transaction.atomic(), conn.cursor() as cursor:
            cursor.execute(self.guard, self.guard_params)
            if cursor.rowcount != 1:
                return None
            selects = []
            for part in self.parts:
                tbl, pk = table(part.model), column(part.model, "pk")
                if part.kind == "select":
                    cursor.execute(part.sql, part.params())
                    row = cursor.fetchone()
                    selects.append(None if row is None else row[0])
                elif part.kind == "insert":
                    cols, phs = _values(part)
                    ret = f" RETURNING {pk}" if part.returning else ""
                    cursor.execute(f"INSERT INTO {tbl} ({cols}) VALUES ({phs}){ret}", part.params())
                    if part.returning:
                        returned.append(cursor.fetchone()[0])
                else:
                    cursor.execute(f"UPDATE {tbl} SET {_sets(part)} WHERE {pk} = %s", part.params())
        return returned + selects


_STATEMENTS: dict[tuple[Any, ...], str] = {}


def _statement(guard: str, parts: list[_Part], sync: bool) -> str:
    """The statement's text, built once per shape (its values are only parameters)."""
    key = (guard, sync, *(p.shape() for p in parts))
    sql = _STATEMENTS.get(key)
    if sql is None:
        sql = _STATEMENTS[key] = _pg_statement(guard, parts, sync)
    return sql


@cache
def _numbered(sql: str) -> str:
    """%s placeholders as PostgreSQL's own $1, $2, ... (this SQL has no other %)."""
    counter = iter(range(1, 10_000))
    return re.sub(r"%s", lambda _: f"${next(counter)}", sql)


@cache
def _preparing_cursor(binary: bool = False) -> type:
    import psycopg

    class PreparingCursor(psycopg.RawCursor):
        """Prepares every statement: the hot path has a handful of shapes, run per step,
        and Django turns psycopg's automatic preparing off for poolers' sake. `binary`:
        results in PostgreSQL's binary format (a bytea arrives as its bytes, not as hex
        text twice as long that the driver then decodes)."""

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", True)
            kwargs.setdefault("binary", binary)
            return super().execute(query, params, **kwargs)

    return PreparingCursor


def _cursor(conn: Any, binary: bool = False) -> CursorWrapper:
    """On PostgreSQL a cursor that sends the statement as is, with $n placeholders and
    the values bound on the server (no client-side parsing of a long statement, and
    psycopg prepares a statement used often), wrapped as Django wraps its own cursors
    (error translation, execute wrappers). The SQL given to it must be _numbered."""
    conn.ensure_connection()
    if conn.vendor != "postgresql":
        return conn.cursor()
    return CursorWrapper(_preparing_cursor(binary)(conn.connection), conn)


def run_statement(sql: str, params: list[Any], conn: Any = None) -> Any:
    """Execute one statement that returns rows; its first row (or None), committed.

    Inside an atomic block (tests, callers' transactions) it runs in a
    savepoint and commits with the block; otherwise it is its own transaction.
    """
    conn = conn or db()
    if conn.vendor == "postgresql":
        sql = _numbered(sql)
    if conn.in_atomic_block:
        with transaction.atomic(), _cursor(conn) as cursor:
            cursor.execute(sql, params)
            return cursor.cursor.fetchone()
    with _cursor(conn) as cursor:
        cursor.execute(sql, params)
        return cursor.cursor.fetchone()


def fetch_all(
    sql: str, params: list[Any], conn: Any = None, binary: bool = False
) -> list[tuple[Any, ...]]:
    """Every row of one read statement, as the driver returns them (no ORM conversion):
    for a read of many rows whose columns the caller decodes itself. `binary`: in
    PostgreSQL's binary format (for many bytes of bytea: half the bytes on the wire and
    no hex to decode; the columns must be of types the driver reads in binary)."""
    conn = conn or db()
    if conn.vendor == "postgresql":
        sql = _numbered(sql)
    with _cursor(conn, binary) as cursor:
        cursor.execute(sql, params)
        return cursor.cursor.fetchall()
