"""A ready worker keeps the cyclic garbage collector off what exists at startup and
collects its young objects every GC_GEN0_THRESHOLD allocations (agentrun.celery)."""

from __future__ import annotations

import gc
import weakref

import pytest

from agentrun import celery as agentrun_celery


@pytest.fixture
def restore_gc():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_startup_objects_are_frozen_and_young_collections_are_rarer(restore_gc):
    gc.unfreeze()
    _, gen1, gen2 = gc.get_threshold()

    agentrun_celery._freeze_startup_objects()

    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (agentrun_celery.GC_GEN0_THRESHOLD, gen1, gen2)


def test_it_runs_when_a_worker_is_ready_and_in_each_prefork_child():
    from celery.signals import worker_process_init, worker_ready

    for signal in (worker_ready, worker_process_init):
        receivers = [r() if isinstance(r, weakref.ref) else r for _, r in signal.receivers]
        assert agentrun_celery._freeze_startup_objects in receivers
