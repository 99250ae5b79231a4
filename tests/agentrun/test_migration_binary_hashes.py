"""Migration 0016b turns stored hex digests into their bytes, and back: same hex read."""

import uuid

import pytest
from django.db import connection

from agentrun.models import Snapshot, ToolCall
from tests.agentrun.migrating import leaves, migrate

BEFORE = [("agentrun", "0016_leaner_tool_calls")]
AFTER = [("agentrun", "0016b_binary_hashes")]
DIGEST = "0123456789abcdef" * 4


@pytest.mark.django_db(transaction=True)
def test_existing_hex_digests_read_back_the_same_after_the_migration_and_after_undoing_it():
    latest = leaves()
    apps = migrate(BEFORE)
    try:
        Run = apps.get_model("agentrun", "Run")
        Step = apps.get_model("agentrun", "Step")
        run = Run.objects.create(id=uuid.uuid4(), agent="scripted")
        step = Step.objects.create(run=run, number=1)
        apps.get_model("agentrun", "Snapshot").objects.create(
            run=run, step=1, at="pre", seq=2, kind="ref", keyframe_seq=2, hash=DIGEST, size=2
        )
        apps.get_model("agentrun", "ToolCall").objects.create(
            run=run, step=step, index=0, tool="echo", kind="read", args_hash=DIGEST[:16]
        )
        migrate(AFTER)
        assert Snapshot.objects.get(run_id=run.pk).hash == DIGEST
        assert ToolCall.objects.get(run_id=run.pk).args_hash == DIGEST[:16]
        assert Snapshot.objects.filter(hash=DIGEST).count() == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT hash FROM agentrun_snapshot")
            assert bytes(cursor.fetchone()[0]) == bytes.fromhex(DIGEST)
        back = migrate(BEFORE)
        assert back.get_model("agentrun", "Snapshot").objects.get(run_id=run.pk).hash == DIGEST
    finally:
        migrate(latest)
