"""LangGraph's own conformance suite for checkpoint savers (langgraph-checkpoint-conformance),
run against the agentrun saver on this test run's database: once through the async
methods (each the sync one on a thread), once calling the sync methods themselves."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES  # noqa: E402

from agentrun.integrations.langgraph import AgentrunSaver  # noqa: E402
from agentrun.integrations.langgraph.saver import AGENT  # noqa: E402
from agentrun.models import Run, Snapshot, Step  # noqa: E402

pytestmark = pytest.mark.django_db


class SyncPath(AgentrunSaver):
    """The async methods call the sync ones in the event loop's thread: the suite then
    checks put, put_writes, get_tuple, list and delete_thread themselves."""

    async def aput(self, config, checkpoint, metadata, new_versions):
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path=""):
        self.put_writes(config, writes, task_id, task_path)

    async def aget_tuple(self, config):
        return self.get_tuple(config)

    async def alist(self, config, *, filter=None, before=None, limit=None):
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def adelete_thread(self, thread_id):
        self.delete_thread(thread_id)


def _fresh() -> None:
    """Each capability's suite starts on an empty store, as with a new database."""
    runs = Run.objects.filter(agent=AGENT)
    Snapshot.objects.filter(run__in=runs).delete()
    Step.objects.filter(run__in=runs).delete()
    runs.delete()


def _check(saver_class: type[AgentrunSaver]) -> None:
    @checkpointer_test(name=saver_class.__name__)
    async def factory():
        await sync_to_async(_fresh)()
        yield saver_class()

    report = async_to_sync(validate)(factory)
    failures = {
        name: [f"{f}" for f in result.failures]
        for name, result in report.results.items()
        if result.passed is False
    }
    assert failures == {}
    ran = {name for name, result in report.results.items() if result.passed}
    assert ran >= {c.value for c in BASE_CAPABILITIES}
    passed = sum(r.tests_passed for r in report.results.values())
    assert passed >= 50, report.results


def test_the_async_methods_pass_langgraphs_conformance_suite():
    _check(AgentrunSaver)


@pytest.mark.django_db(transaction=True)
def test_the_sync_methods_pass_langgraphs_conformance_suite(monkeypatch):
    # The sync methods called inside the suite's event loop, on its thread (which has a
    # database connection of its own, hence a transactional test): allowed here.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    _check(SyncPath)
