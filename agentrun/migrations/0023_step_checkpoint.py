"""A step's framework checkpoint (LangGraph's) moves out of its decision into a compressed
column of its own, `Step.checkpoint` (agentrun.store.checkpoints).

The steps of LangGraph threads kept it in `decision["langgraph_serialized"]`, each byte
string as base64 text: it moves to the new column with its bytes as one character a byte,
each channel value whole; the versions each step wrote stay in the decision
(`langgraph.written`), where the saver looks them up. Going back rebuilds the old form, an
appended list's value whole again.
"""

import base64
from typing import Any

from django.db import migrations

import agentrun.models
from agentrun.store import checkpoints

BATCH = 100


def _langgraph_steps(apps):
    Step = apps.get_model("agentrun", "Step")
    return Step, Step.objects.filter(run__agent="langgraph").order_by("run_id", "number")


def _old_bytes(kind, data):
    return [kind, base64.b64encode(data).decode()]


def _save(Step, batch, fields):
    if batch:
        Step.objects.bulk_update(batch, fields)
    return []


def forward(apps, schema_editor):
    Step, steps = _langgraph_steps(apps)
    batch = []
    for step in steps.iterator(chunk_size=BATCH):
        decision = step.decision or {}
        record = checkpoints.moved_out(decision)
        if record is None:
            continue
        step.decision, step.checkpoint = decision, record
        batch.append(step)
        if len(batch) == BATCH:
            batch = _save(Step, batch, ["decision", "checkpoint"])
    _save(Step, batch, ["decision", "checkpoint"])


def backward(apps, schema_editor):
    Step, steps = _langgraph_steps(apps)
    records: dict = {}
    batch = []
    for step in steps.exclude(checkpoint__isnull=True).iterator(chunk_size=BATCH):
        if step.run_id not in records:
            records = {step.run_id: {}}  # the steps of one run at a time
        run_records = records[step.run_id]
        record = run_records[step.number] = step.checkpoint
        old: dict[str, Any] = {
            "writes": [
                [task, idx, channel, *_old_bytes(kind, checkpoints.data(data)), path]
                for task, idx, channel, kind, data, path in record.get("writes", [])
            ]
        }
        if "checkpoint" in record:
            for key in ("checkpoint", "metadata"):
                kind, data = record[key]
                old[key] = _old_bytes(kind, checkpoints.data(data))
            old["blob_at"] = record["blob_at"]
            old["blobs"] = {}
            for channel in record["blobs"]:
                value = checkpoints.value_bytes(run_records, step.number, channel)
                old["blobs"][channel] = _old_bytes(*value) if value else ["empty", ""]
            old["written"] = step.decision["langgraph"].pop("written", {})
        step.decision["langgraph_serialized"] = old
        step.checkpoint = None
        batch.append(step)
        if len(batch) == BATCH:
            batch = _save(Step, batch, ["decision", "checkpoint"])
    _save(Step, batch, ["decision", "checkpoint"])


class Migration(migrations.Migration):
    dependencies = [
        ("agentrun", "0022_step_trace_due"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="checkpoint",
            field=agentrun.models.CompressedJSONField(blank=True, null=True),
        ),
        migrations.RunPython(forward, backward),
    ]
