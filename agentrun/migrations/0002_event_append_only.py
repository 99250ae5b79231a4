"""Events are append-only: the database refuses UPDATE and DELETE on them.

PostgreSQL only (SQLite's embedded mode relies on Event.save/delete guards).
TRUNCATE, which test teardown uses, is deliberately not blocked.
"""

from django.db import migrations

FORWARD = """
CREATE OR REPLACE FUNCTION agentrun_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'agentrun_event is append-only: %% refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER agentrun_event_append_only
    BEFORE UPDATE OR DELETE ON agentrun_event
    FOR EACH ROW EXECUTE FUNCTION agentrun_event_append_only();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS agentrun_event_append_only ON agentrun_event;
DROP FUNCTION IF EXISTS agentrun_event_append_only();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("agentrun", "0001_initial")]
    operations = [migrations.RunPython(forward, backward)]
