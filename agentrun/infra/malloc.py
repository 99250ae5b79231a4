"""How much freed memory a process keeps for its next allocations (glibc's malloc).

A step allocates and frees the same few hundred KB every time: zlib's state for each
value it compresses (about 260 KB: window, hash chains, output buffer), the JSON texts,
the rows. glibc hands the top of its heap back to the kernel once 128 KB of it are free,
so the next step's allocations fault the same pages in again: about 40 page faults a
step, 4-8% of its CPU time (bench/RESULTS.md#step-cpu). Keeping up to
AGENTRUN_MALLOC_TRIM_MB free at the top makes them reuse the memory; allocations of
MMAP_MB or more still get pages of their own, given back when freed.

Only on glibc (mallopt); elsewhere, or with AGENTRUN_MALLOC_TRIM_MB = 0, nothing is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_MB = 4


def keep_freed_memory(trim_mb: int) -> bool:
    """Set glibc's trim threshold to `trim_mb` MB (and its mmap threshold to MMAP_MB,
    which setting the first stops glibc from adjusting). Whether it was set."""
    if trim_mb <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has no such threshold
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("malloc: not glibc, its thresholds are left as they are")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_TRIM_THRESHOLD, trim_mb * 1024 * 1024) == 1
    return mallopt(M_MMAP_THRESHOLD, MMAP_MB * 1024 * 1024) == 1 and ok
