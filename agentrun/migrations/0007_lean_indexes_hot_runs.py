"""Fewer index bytes per step, and run updates that PostgreSQL can do in place (HOT).

- Foreign-key indexes that a composite index already starts with are dropped.
- Runs: no index holds lease_expires_at any more, so claim and commit change no
  indexed column; a fillfactor leaves room on each page for the new row versions.
- The audit indexes cover only what the audit page lists: side-effect calls and
  operator events, not the per-step read calls and system events.
- Snapshots get a "fork" kind: a reference to the source snapshot of the parent run.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

RUN_FILLFACTOR = 80


def set_run_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE agentrun_run SET (fillfactor = {RUN_FILLFACTOR})")


def reset_run_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE agentrun_run RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0006_compressed_json"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(model_name="event", name="event_kind_created"),
        migrations.RemoveIndex(model_name="run", name="run_status_lease"),
        migrations.RemoveIndex(model_name="toolcall", name="toolcall_kind_created"),
        migrations.AlterField(
            model_name="event",
            name="run",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="events",
                to="agentrun.run",
            ),
        ),
        migrations.AlterField(
            model_name="event",
            name="user",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="snapshot",
            name="chain_bytes",
            field=models.IntegerField(
                default=0, help_text="delta bytes a read replays (a fork's include its source's)"
            ),
        ),
        migrations.AlterField(
            model_name="snapshot",
            name="kind",
            field=models.CharField(
                choices=[("full", "Full"), ("delta", "Delta"), ("ref", "Ref"), ("fork", "Fork")],
                max_length=8,
            ),
        ),
        migrations.AlterField(
            model_name="snapshot",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="snapshots",
                to="agentrun.run",
            ),
        ),
        migrations.AlterField(
            model_name="snapshot",
            name="stored_bytes",
            field=models.IntegerField(
                default=0, help_text="bytes of data as compact JSON (stored compressed)"
            ),
        ),
        migrations.AlterField(
            model_name="step",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="steps",
                to="agentrun.run",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tool_calls",
                to="agentrun.run",
            ),
        ),
        migrations.AlterField(
            model_name="toolcall",
            name="step",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tool_calls",
                to="agentrun.step",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(
                condition=models.Q(("user__isnull", False)),
                fields=["-created_at"],
                name="event_actions",
            ),
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                condition=models.Q(("kind__in", ("write", "hybrid"))),
                fields=["-created_at"],
                name="toolcall_side_effects",
            ),
        ),
        migrations.RunPython(set_run_fillfactor, reset_run_fillfactor),
    ]
