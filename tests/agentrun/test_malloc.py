"""A process keeps freed memory for its next allocations (agentrun.infra.malloc): what a step
allocates and frees is reused, not handed back to the kernel and faulted in again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# 30 MB in blocks of 100 KB (a step's texts and zlib states are of that size), freed:
# how much of it the process handed back to the kernel.
HANDED_BACK = """
import django
django.setup()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
blocks = [bytearray(100_000) for _ in range(300)]
high = rss()
del blocks
print(high - rss())
"""


def handed_back(trim_mb: int) -> int:
    env = {**os.environ, "AGENTRUN_MALLOC_TRIM_MB": str(trim_mb)}
    out = subprocess.run(
        [sys.executable, "-c", HANDED_BACK], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc")
def test_a_process_keeps_freed_memory_up_to_the_setting_and_glibc_default_without():
    assert handed_back(64) < 1_000_000
    assert handed_back(0) > 25_000_000  # glibc's own default: all of it
    assert handed_back(16) > 10_000_000  # more than 16 MB free: the rest is handed back
