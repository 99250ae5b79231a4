"""kombu's Redis transport, with one Redis client per channel for its plain commands.

kombu builds a new `redis.Redis` for every publish, every ack and every "unacked"
bookkeeping write; with redis-py 8 building one costs ~0.3 ms of CPU (it fills a
table of ~170 response callbacks), three times per step on the worker. A client is
safe to share: each command borrows a connection from the channel's pool (which
resets itself in a forked child) and gives it back. Selected in agentrun.celery
for redis:// and rediss:// broker URLs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis
from kombu.utils.objects import cached_property


class Channel(redis.Channel):
    @cached_property
    def _commands_client(self) -> Any:
        return self._create_client()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._commands_client


class Transport(redis.Transport):
    Channel = Channel
