"""A LangGraph thread's run exported and imported: the saver reads it back the same, from an
archive of today and from one exported before a step's record had a column of its own."""

from __future__ import annotations

import base64

import pytest

pytest.importorskip("langgraph")

from agentrun.integrations.langgraph import AgentrunSaver, run_id_for  # noqa: E402
from agentrun.models import Run  # noqa: E402
from agentrun.store import checkpoints  # noqa: E402
from tests.agentrun.archives import export_bytes, import_bytes, pack, records  # noqa: E402
from tests.langgraph.test_saver import _grow  # noqa: E402

pytestmark = pytest.mark.django_db


def _history(saver, thread):
    config = {"configurable": {"thread_id": thread}}
    return [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config)]


def _as_before(recs):
    """The archive's step records as they were exported before: the record in the
    decision, base64 text, each value whole."""
    steps = {r["number"]: r for r in recs if r["type"] == "step"}
    kept = {n: r["checkpoint"] for n, r in steps.items()}
    for number, rec in steps.items():
        record = rec.pop("checkpoint")

        def b64(kind, text):
            return [kind, base64.b64encode(checkpoints.data(text)).decode()]

        blobs = {}
        for channel in record["blobs"]:
            value = checkpoints.value_bytes(kept, number, channel)
            blobs[channel] = (
                [value[0], base64.b64encode(value[1]).decode()] if value else ["empty", ""]
            )
        rec["decision"]["langgraph_serialized"] = {
            "checkpoint": b64(*record["checkpoint"]),
            "metadata": b64(*record["metadata"]),
            "blobs": blobs,
            "blob_at": record["blob_at"],
            "written": rec["decision"]["langgraph"].pop("written"),
            "writes": [[t, i, c, *b64(k, d), p] for t, i, c, k, d, p in record["writes"]],
        }
    return recs


@pytest.mark.parametrize("before", [False, True], ids=["today", "before-the-column"])
def test_an_imported_thread_reads_back_as_it_was_exported(before):
    saver = AgentrunSaver()
    stored = _grow(saver, "exported", checkpoints.CHAIN + 3)
    saver.put_writes(stored[-1][0], [("count", 99)], "task-1")
    expected = _history(saver, "exported")
    data = export_bytes(Run.objects.get(pk=run_id_for("exported")))
    if before:
        data = pack(_as_before(records(data)))
    saver.delete_thread("exported")
    assert _history(saver, "exported") == []
    import_bytes(data)
    assert _history(AgentrunSaver(), "exported") == expected
