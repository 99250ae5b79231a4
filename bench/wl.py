"""The shared workload module, loaded once per process.

The reference is ../shared/bench/workload.py (relative to the repository); it is
imported unchanged from there when present, else from the verbatim copy in
bench/workload.py. Worker processes load it the same way (bench.agent imports this).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SHARED = ROOT.parent / "shared" / "bench" / "workload.py"
COPY = BENCH / "workload.py"
MODULE_NAME = "agentrun_bench_workload"

# WORKLOAD.md's table: (variant, N) -> (state bytes, fingerprint).
EXPECTED = {
    ("grow", 50): (129_664, "1623bb02d8e87285"),
    ("grow", 200): (512_691, "5ad8db04c9c04530"),
    ("grow", 1000): (2_556_318, "d0a1e97f344ecef5"),
    ("flat", 1000): (52_488, "bcf8e186ba6b57ea"),
}


def _load() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    path = SHARED if SHARED.is_file() else COPY
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


workload = _load()
SOURCE = Path(workload.__file__ or COPY)


def source_info() -> dict[str, str | bool]:
    """Which file was loaded, its sha256, and whether the bench/ copy still matches it."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    copy_digest = hashlib.sha256(COPY.read_bytes()).hexdigest() if COPY.is_file() else ""
    return {"path": str(SOURCE), "sha256": digest, "copy_matches": digest == copy_digest}


_expected_cache: dict[tuple[str, int], str] = {}


def expected_fingerprint(variant: str, n: int) -> str:
    """The fingerprint of the state after n steps: WORKLOAD.md's table, else build_state."""
    if (variant, n) in EXPECTED:
        return EXPECTED[(variant, n)][1]
    if (variant, n) not in _expected_cache:
        _expected_cache[(variant, n)] = workload.fingerprint(workload.build_state(n, variant))
    return _expected_cache[(variant, n)]


def check_table() -> None:
    """The loaded workload reproduces WORKLOAD.md's table (sizes and fingerprints)."""
    for (variant, n), (size, fp) in EXPECTED.items():
        state = workload.build_state(n, variant)
        got = (workload.json_size(state), workload.fingerprint(state))
        if got != (size, fp):
            raise AssertionError(
                f"workload {variant} N={n}: {got} != {(size, fp)} from WORKLOAD.md"
            )
