"""The event log refuses TRUNCATE too, even for the owner of the table.

0002 refuses UPDATE and DELETE row by row; TRUNCATE fires no row triggers, so it
gets a statement-level one. PostgreSQL only (the embedded SQLite relies on the
model's guards). Emptying the log on purpose (a test database between tests) takes
a superuser's `SET LOCAL session_replication_role = replica`, which skips triggers.
"""

from django.db import migrations

FORWARD = """
CREATE TRIGGER agentrun_event_no_truncate
    BEFORE TRUNCATE ON agentrun_event
    FOR EACH STATEMENT EXECUTE FUNCTION agentrun_event_append_only();
"""

BACKWARD = "DROP TRIGGER IF EXISTS agentrun_event_no_truncate ON agentrun_event;"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("agentrun", "0007_lean_indexes_hot_runs")]
    operations = [migrations.RunPython(forward, backward)]
