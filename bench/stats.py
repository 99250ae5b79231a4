"""Small statistics helpers: every figure is reported as median (min-max)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any


def summary(samples: Sequence[float]) -> dict[str, float]:
    """median, min, max (and count) of samples; empty when there are none."""
    if not samples:
        return {}
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def quantile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steps_summary(ms: Sequence[float]) -> dict[str, float]:
    """Per-step times (ms): median over all steps, of the last 10, p90 and the worst step."""
    return {
        "median": statistics.median(ms),
        "last10": statistics.median(ms[-10:]),
        "p10": quantile(ms, 0.1),
        "p90": quantile(ms, 0.9),
        "max": max(ms),
        "n": len(ms),
    }


def timed(fn: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """Call fn `repeat` times; the times in ms and the last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = perf_counter()
        result = fn()
        times.append((perf_counter() - t0) * 1000)
    return times, result


def pooled(repeats: list[dict[str, Any]], *path: str) -> dict[str, float]:
    """Median and min-max across repeats of one per-repeat number."""
    values = []
    for r in repeats:
        v: Any = r
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        if isinstance(v, int | float):
            values.append(float(v))
    return summary(values)
