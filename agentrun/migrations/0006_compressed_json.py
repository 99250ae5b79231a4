"""Snapshot.data (JSON text) and ToolCall.result (jsonb) become zlib-compressed JSON.

PostgreSQL can't cast either to bytea meaningfully, so each column is renamed
aside, the new one added, the values copied through Python, the old one dropped.
"""

import agentrun.models
from django.db import migrations

BATCH = 100


def _copy(apps, model_name, source, target):
    model = apps.get_model("agentrun", model_name)
    rows = model.objects.exclude(**{f"{source}__isnull": True}).only("pk", source)
    batch = []
    for row in rows.iterator(chunk_size=BATCH):
        setattr(row, target, getattr(row, source))
        batch.append(row)
        if len(batch) == BATCH:
            model.objects.bulk_update(batch, [target])
            batch = []
    if batch:
        model.objects.bulk_update(batch, [target])


def compress(apps, schema_editor):
    _copy(apps, "Snapshot", "data_text", "data")
    _copy(apps, "ToolCall", "result_jsonb", "result")


def decompress(apps, schema_editor):
    _copy(apps, "Snapshot", "data", "data_text")
    _copy(apps, "ToolCall", "result", "result_jsonb")


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0005_leaner_indexes"),
    ]

    operations = [
        migrations.RenameField(model_name="snapshot", old_name="data", new_name="data_text"),
        migrations.AddField(
            model_name="snapshot",
            name="data",
            field=agentrun.models.CompressedJSONField(blank=True, null=True),
        ),
        migrations.RenameField(model_name="toolcall", old_name="result", new_name="result_jsonb"),
        migrations.AddField(
            model_name="toolcall",
            name="result",
            field=agentrun.models.CompressedJSONField(blank=True, null=True),
        ),
        migrations.RunPython(compress, decompress),
        migrations.RemoveField(model_name="snapshot", name="data_text"),
        migrations.RemoveField(model_name="toolcall", name="result_jsonb"),
    ]
