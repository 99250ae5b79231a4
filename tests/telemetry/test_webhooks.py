"""The webhook's reconciler sweep and its limits, in one process: a failure nobody notified is
notified once, a delivery is posted at most once, a receiver that keeps failing is given up."""

from __future__ import annotations

import pytest

from agentrun.models import DeliveryStatus, WebhookDelivery
from agentrun.telemetry import webhooks
from tests.base import calls, drive, final, make_run, script
from tests.telemetry.hooks_receiver import HookReceiver

pytestmark = pytest.mark.django_db


def failed_run():
    run = drive(make_run(script(calls({"tool": "fail", "args": {}}), final())))
    assert run.status == "failed"
    return run


def test_the_sweep_notifies_a_failure_nobody_notified_once(settings):
    with HookReceiver() as receiver:
        settings.AGENTRUN_WEBHOOK_URL, settings.AGENTRUN_WEBHOOK_SECRET = receiver.url, "s"
        run = failed_run()  # in this process with no broker: its own notice made the row
        WebhookDelivery.objects.all().delete()  # as if the worker died before it could
        assert webhooks.sweep()["notified"] == 1
        assert webhooks.sweep()["notified"] == 0
        (delivery,) = WebhookDelivery.objects.filter(run=run)
        assert webhooks.deliver(delivery.pk) is None
        assert webhooks.deliver(delivery.pk) is None  # delivered: not posted again
        assert len(receiver.posts) == 1
        delivery.refresh_from_db()
        assert delivery.status == DeliveryStatus.DELIVERED and delivery.delivered_at


def test_a_receiver_that_keeps_failing_is_given_up(settings):
    with HookReceiver(500, 502, 503) as receiver:
        settings.AGENTRUN_WEBHOOK_URL, settings.AGENTRUN_WEBHOOK_SECRET = receiver.url, "s"
        settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS = 3
        settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = 0
        failed_run()
        (delivery,) = WebhookDelivery.objects.all()
        assert webhooks.deliver(delivery.pk) == 0  # again at once (a delay of 0 s)
        assert webhooks.deliver(delivery.pk) == 0
        assert webhooks.deliver(delivery.pk) is None
        delivery.refresh_from_db()
        assert delivery.status == DeliveryStatus.GAVE_UP and delivery.attempts == 3
        assert delivery.last_error == "HTTP 503"
        assert webhooks.deliver(delivery.pk) is None and len(receiver.posts) == 3


def test_a_delivery_not_due_yet_is_not_posted_early(settings):
    with HookReceiver(500) as receiver:
        settings.AGENTRUN_WEBHOOK_URL, settings.AGENTRUN_WEBHOOK_SECRET = receiver.url, "s"
        settings.AGENTRUN_WEBHOOK_RETRY_SECONDS = 60
        failed_run()
        (delivery,) = WebhookDelivery.objects.all()
        assert webhooks.deliver(delivery.pk) == 60
        assert webhooks.deliver(delivery.pk) is None  # a second message: not due, not sent
        assert len(receiver.posts) == 1


def test_no_url_no_deliveries(settings):
    settings.AGENTRUN_WEBHOOK_URL = ""
    failed_run()
    assert webhooks.sweep() == {"notified": 0, "resent": 0}
    assert not WebhookDelivery.objects.exists()


def test_a_crashing_step_and_a_stuck_run_are_notified_once_each(settings):
    from datetime import timedelta

    from django.utils import timezone

    from agentrun.models import Run

    with HookReceiver() as receiver:
        settings.AGENTRUN_WEBHOOK_URL, settings.AGENTRUN_WEBHOOK_SECRET = receiver.url, "s"
        settings.AGENTRUN_WEBHOOK_STUCK_MINUTES = 30
        crashed, stuck, fresh = make_run(), make_run(), make_run()
        Run.objects.filter(pk=crashed.pk).update(status="waiting", wait_reason="crashed")
        an_hour_ago = timezone.now() - timedelta(hours=1)
        Run.objects.filter(pk__in=[stuck.pk, crashed.pk]).update(updated_at=an_hour_ago)
        assert webhooks.sweep()["notified"] == 2
        assert webhooks.sweep()["notified"] == 0
        made = {(d.run_id, d.event, d.step) for d in WebhookDelivery.objects.all()}
        assert made == {(crashed.pk, "step_crashed", 1), (stuck.pk, "run_stuck", 1)}
        for delivery in WebhookDelivery.objects.all():
            webhooks.deliver(delivery.pk)
        texts = {p.json["event"]: p.json["text"] for p in receiver.posts}
        assert "is stuck (queued)" in texts["run_stuck"]
        assert "a step kept crashing" in texts["step_crashed"]
        assert str(fresh.pk)[:8] not in " ".join(texts.values())

        settings.AGENTRUN_WEBHOOK_STUCK_MINUTES = 0  # off
        WebhookDelivery.objects.filter(event="run_stuck").delete()
        assert webhooks.sweep()["notified"] == 0
