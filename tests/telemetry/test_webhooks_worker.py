"""The failure webhook with a real worker: one signed delivery per failed run, posted again
(the same delivery) after the receiver answered 500, and never again once it took it."""

from __future__ import annotations

import hmac
import time

import pytest

from agentrun.lifecycle import services
from agentrun.models import DeliveryStatus, Run, WebhookDelivery
from agentrun.telemetry import webhooks
from tests.base import calls, final, script
from tests.telemetry.hooks_receiver import HookReceiver
from tests.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

SECRET = "webhook-shared-secret"


def failing(message: str) -> Run:
    return services.start_run(
        "scripted", script(calls({"tool": "fail", "args": {"message": message}}), final())
    )


def test_each_failed_run_is_delivered_once_signed_and_again_after_a_500(start_worker):
    with HookReceiver(500) as receiver:
        start_worker(
            AGENTRUN_WEBHOOK_URL=receiver.url,
            AGENTRUN_WEBHOOK_SECRET=SECRET,
            AGENTRUN_WEBHOOK_RETRY_SECONDS="0.5",
        )
        first = failing("the card was declined")
        wait_until(lambda: len(receiver.taken()) == 1, timeout=60, what="the first delivery")
        second = failing("out of stock")
        ok = services.start_run("scripted", script(calls({"tool": "echo", "args": {}}), final()))
        wait_until(lambda: len(receiver.taken()) == 2, timeout=60, what="the second delivery")
        wait_until(lambda: Run.objects.get(pk=ok.pk).status == "succeeded", timeout=30)
        time.sleep(2)  # nothing more comes
        posts = list(receiver.posts)

    assert [p.answered for p in posts] == [500, 200, 200]
    # The 500 was retried as the same delivery, not a new one.
    assert posts[0].headers["X-Agentrun-Delivery"] == posts[1].headers["X-Agentrun-Delivery"]
    assert posts[1].headers["X-Agentrun-Delivery"] != posts[2].headers["X-Agentrun-Delivery"]
    for post, run, error in ((posts[1], first, "the card was declined"), (posts[2], second, "out of stock")):  # fmt: skip
        headers = post.headers
        expected = webhooks.sign(post.body, headers["X-Agentrun-Timestamp"], SECRET)
        assert hmac.compare_digest(headers["X-Agentrun-Signature"], expected)
        assert headers["X-Agentrun-Signature"] != webhooks.sign(post.body + b" ", headers["X-Agentrun-Timestamp"], SECRET)  # fmt: skip
        assert headers["X-Agentrun-Event"] == "run_failed"
        assert headers["Content-Type"] == "application/json"
        body = post.json
        assert body["event"] == "run_failed"
        assert body["run"]["id"] == str(run.pk) and body["run"]["status"] == "failed"
        assert error in body["run"]["error"] and error in body["text"]  # Slack's field
        assert body["run"]["url"].endswith(f"/runs/{run.pk}/steps/1/")
    deliveries = {d.run_id: d for d in WebhookDelivery.objects.all()}
    assert set(deliveries) == {first.pk, second.pk}  # none for the run that succeeded
    assert deliveries[first.pk].status == DeliveryStatus.DELIVERED
    assert deliveries[first.pk].attempts == 2 and deliveries[second.pk].attempts == 1
