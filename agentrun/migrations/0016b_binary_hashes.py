"""Snapshot.hash and ToolCall.args_hash: the digest's 32 bytes, not its 64-character hex.

Python still sees the hex text (models.HashField). Existing rows are converted in place:
on PostgreSQL by one ALTER ... USING decode(hex), on SQLite by rebuilding the table (as
any AlterField does there) and then decoding each value.
"""

from django.db import migrations, models

import agentrun.models

COLUMNS = (("snapshot", "hash"), ("toolcall", "args_hash"))


def _fields(apps, model_name, name):
    model = apps.get_model("agentrun", model_name)
    old, new = models.CharField(max_length=64), agentrun.models.HashField()
    for field in (old, new):
        field.set_attributes_from_name(name)
        field.model = model
    return model, old, new


def _convert(apps, schema_editor, decode):
    conn = schema_editor.connection
    for model_name, name in COLUMNS:
        model, old, new = _fields(apps, model_name, name)
        table = model._meta.db_table
        if conn.vendor == "postgresql":
            if decode:
                sql = f"ALTER TABLE {table} ALTER COLUMN {name} TYPE bytea USING decode({name}, 'hex')"
            else:
                sql = f"ALTER TABLE {table} ALTER COLUMN {name} TYPE varchar(64) USING encode({name}, 'hex')"
            schema_editor.execute(sql)
            continue
        if decode:
            schema_editor.alter_field(model, old, new)
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT id, {name} FROM {table}")  # noqa: S608 - our own table
            rows = cursor.fetchall()
            for pk, value in rows:
                if decode and isinstance(value, str):
                    cursor.execute(
                        f"UPDATE {table} SET {name} = %s WHERE id = %s",  # noqa: S608
                        [bytes.fromhex(value), pk],
                    )
                elif not decode and isinstance(value, bytes | memoryview):
                    cursor.execute(
                        f"UPDATE {table} SET {name} = %s WHERE id = %s",  # noqa: S608
                        [bytes(value).hex(), pk],
                    )
        if not decode:
            schema_editor.alter_field(model, new, old)


def forward(apps, schema_editor):
    _convert(apps, schema_editor, decode=True)


def backward(apps, schema_editor):
    _convert(apps, schema_editor, decode=False)


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0016_leaner_tool_calls"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forward, backward)],
            state_operations=[
                migrations.AlterField(
                    model_name="snapshot", name="hash", field=agentrun.models.HashField()
                ),
                migrations.AlterField(
                    model_name="toolcall", name="args_hash", field=agentrun.models.HashField()
                ),
            ],
        ),
    ]

