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
from queue import Empty
from typing import Any

from kombu.transport import redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from kombu.utils.objects import cached_property

# Messages taken per wake-up of the consumer beyond the one BRPOP returned.
BATCH = 64


class Channel(redis.Channel):
    @cached_property
    def _commands_client(self) -> Any:
        return self._create_client()

    def _brpop_read(self, **options: Any) -> bool:
        """BRPOP's message, then as many more from the same list as the prefetch
        allows (one RPOP with a count: one more round trip).

        kombu takes one message per turn of the worker's event loop, and a worker
        whose threads are busy gets a turn every few milliseconds: a burst of new
        runs waited in Redis for seconds while most of the worker's threads sat idle.
        """
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()  # the next turn reconnects
                raise
            if not reply:
                raise Empty()
            key, first = reply
            queue = bytes_to_str(key).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            room = self.qos.can_consume_max_estimate()
            more = BATCH if room is None else min(BATCH, room - 1)
            items = [first]
            if more > 0:
                items += self._commands_client.rpop(key, more) or []
            for item in items:
                self.connection._deliver(loads(bytes_to_str(item)), queue)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield client or self._commands_client


class Transport(redis.Transport):
    Channel = Channel
