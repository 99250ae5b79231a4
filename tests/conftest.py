from unittest import mock

import pytest
from django.conf import settings
from django.db.backends.postgresql.operations import DatabaseOperations


@pytest.fixture(autouse=True)
def _engine_settings(settings):
    # Tests drive the engine themselves unless they start a worker.
    settings.AGENTRUN_ENQUEUE = False
    settings.AGENTRUN_FAULTS = True
    settings.AGENTRUN_LEASE_SECONDS = 3.0
    # PBKDF2 costs about a second per user on these machines.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield


@pytest.fixture(autouse=True, scope="session")
def _flush_past_the_event_log_trigger():
    """Between transactional tests Django empties every table in one TRUNCATE, which the
    event log refuses (migration 0008). The test database's superuser skips triggers for
    that one transaction, as a replica would; nothing else in the tests does."""
    sql_flush = DatabaseOperations.sql_flush

    def sql_flush_past_triggers(self, style, tables, **kwargs):
        statements = sql_flush(self, style, tables, **kwargs)
        if not statements:
            return statements
        return ["SET LOCAL session_replication_role = replica", *statements]

    with mock.patch.object(DatabaseOperations, "sql_flush", sql_flush_past_triggers):
        yield


@pytest.fixture(autouse=True, scope="session")
def _drop_the_test_database_past_a_pooler():
    """PgBouncer keeps its server connections to the test database open after the tests
    closed theirs, and PostgreSQL refuses to drop a database in use: drop it by force
    (which ends those connections; PgBouncer opens new ones when asked)."""
    if not settings.AGENTRUN_PGBOUNCER:
        yield
        return
    from django.db.backends.postgresql.creation import DatabaseCreation

    def destroy_by_force(self, test_database_name, verbosity):
        with self._nodb_cursor() as cursor:
            name = self.connection.ops.quote_name(test_database_name)
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")

    with mock.patch.object(DatabaseCreation, "_destroy_test_db", destroy_by_force):
        yield


@pytest.fixture
def on_v1(monkeypatch):
    """The `refunds` agent as its buggy v1, in a process that says it runs v1."""
    from tests.fleet.scenario import run_on_v1

    run_on_v1(monkeypatch)


def pytest_report_header(config):
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"agentrun: database={db} broker={settings.CELERY_BROKER_URL.split(':', 1)[0]}"
