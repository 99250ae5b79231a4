"""Each worker process's cache of the latest state of each run it works on.

Saves rebuilding a state from keyframe + deltas at every step. Validated by
the snapshot hash, so a stale entry is never used."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings

from agentrun.models import (
    Snapshot,
)
from agentrun.store import hashing

# Saves rebuilding a state from keyframe + deltas at every step. Validated by
# the snapshot hash, so a stale entry is never used.
# Bounded by the states' bytes, not their number: a process with hundreds of runs in
# flight keeps each one's state, and a few huge states can't take all the memory.
_CACHE: OrderedDict[str, tuple[int, str, dict[str, Any], hashing.Node, int]] = OrderedDict()


_CACHE_LOCK = threading.Lock()


_cache_bytes = 0


def cache_get(run_id: str, digest: str) -> tuple[dict[str, Any], hashing.Node] | None:
    """The cached latest state of a run, if it has this hash (a REF's is its target's)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(run_id)
        if hit and hit[1] == digest:
            _CACHE.move_to_end(run_id)
            return hit[2], hit[3]
    return None


def cache_put(
    run_id: str, seq: int, digest: str, state: dict[str, Any], node: hashing.Node, size: int
) -> None:
    global _cache_bytes
    budget = settings.AGENTRUN_STATE_CACHE_MB * 1024 * 1024
    # A state in memory, with its hash tree, takes many times its JSON (measured: ~17x
    # for a 1 KB state, less for big strings): count it as such.
    size = 8 * size + 4096
    with _CACHE_LOCK:
        old = _CACHE.pop(run_id, None)
        _cache_bytes -= old[4] if old else 0
        _CACHE[run_id] = (seq, digest, state, node, size)
        _cache_bytes += size
        while _cache_bytes > budget and len(_CACHE) > 1:
            _cache_bytes -= _CACHE.popitem(last=False)[1][4]


def remember_state(run_id: Any, snap: Snapshot, state: dict[str, Any], node: hashing.Node) -> None:
    """Seed this process's cache with a state just written (e.g. a fork's first one)."""
    cache_put(str(run_id), snap.seq, snap.hash, state, node, snap.size)
