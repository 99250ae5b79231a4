"""On Redis, a channel sends all its plain commands through one client."""

import pytest
from django.conf import settings
from kombu.simple import SimpleQueue

from agentrun.celery import app as celery_app
from agentrun.infra.redis import Channel

pytestmark = pytest.mark.skipif(
    not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")),
    reason="the broker is not Redis",
)


def test_a_redis_channel_publishes_receives_and_acks_with_one_client(monkeypatch):
    created: list[bool] = []
    create = Channel._create_client

    def counting(self, asynchronous=False):
        created.append(asynchronous)
        return create(self, asynchronous)

    monkeypatch.setattr(Channel, "_create_client", counting)
    with celery_app.connection_for_write() as conn:
        channel = conn.channel()
        assert isinstance(channel, Channel)
        queue = SimpleQueue(channel, "agentrun-test-celery-redis")
        try:
            for n in range(3):
                queue.put({"n": n})
            received, tags = [], []
            for _ in range(3):
                message = queue.get(timeout=5)
                received.append(message.payload["n"])
                tags.append(message.delivery_tag)
                message.ack()
            assert sorted(received) == [0, 1, 2]
            with channel.conn_or_acquire() as client:  # no longer held for redelivery
                assert not any(client.hexists(channel.unacked_key, tag) for tag in tags)
        finally:
            queue.clear()
            channel.queue_delete(queue.queue.name)
            queue.close()
    # The channel's own client (for BRPOP) aside, one more; kombu alone makes one per
    # publish, get and ack.
    assert created.count(False) == 1, created
