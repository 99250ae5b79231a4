"""The benchmark suite: replays the shared workload through the real engine (see README.md)."""
