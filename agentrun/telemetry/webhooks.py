"""The failure webhook: a JSON POST to AGENTRUN_WEBHOOK_URL when a run fails, a step keeps
crashing (its run waits for an operator) or a run is stuck (not ended, and nothing happened
to it for AGENTRUN_WEBHOOK_STUCK_MINUTES), signed with AGENTRUN_WEBHOOK_SECRET.

Each notification is a `WebhookDelivery` row, made once per (run, event, step): by the
worker as the run fails, or by the reconciler for one it missed (a worker killed just
then). A Celery task delivers it, retrying with growing delays (AGENTRUN_WEBHOOK_RETRY_SECONDS,
doubled each time, at most AGENTRUN_WEBHOOK_MAX_ATTEMPTS attempts); the reconciler sends again
any that is overdue (a lost message). An attempt claims the row first, so a delivery is
posted by one sender at a time and never again once a receiver said 2xx.

The body is JSON that Slack-compatible receivers accept (a `text`) with the facts beside
it. Headers: `X-Agentrun-Event`, `X-Agentrun-Delivery` (the same on every retry),
`X-Agentrun-Timestamp` and `X-Agentrun-Signature: sha256=<hex>`, the HMAC-SHA256 of
`<timestamp>.<body>` with the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from agentrun.infra.queue import ask
from agentrun.models import (
    DeliveryStatus,
    Run,
    RunStatus,
    WaitReason,
    WebhookDelivery,
)

log = logging.getLogger(__name__)

TASK = "agentrun.webhook"
RUN_FAILED = "run_failed"
STEP_CRASHED = "step_crashed"
RUN_STUCK = "run_stuck"
# The reconciler looks this far back for failures nobody notified.
LOOK_BACK = timedelta(hours=1)


def enabled() -> bool:
    return bool(settings.AGENTRUN_WEBHOOK_URL)


def sign(body: bytes, timestamp: str, secret: str) -> str:
    """The signature header's value for a body sent at `timestamp` (Unix seconds, as text)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def payload(run: Run, event: str, step: int) -> dict[str, Any]:
    url = f"{settings.AGENTRUN_SITE_URL}/runs/{run.pk}/steps/{step}/"
    what = {
        RUN_FAILED: "failed",
        STEP_CRASHED: "is waiting: a step kept crashing",
        RUN_STUCK: f"is stuck ({run.status}{', ' + run.wait_reason if run.wait_reason else ''})",
    }[event]
    error = (run.error or "").strip()
    text = f"agentrun: run {str(run.pk)[:8]} ({run.agent}) {what} at step {step}"
    text += f": {error[:300]}" if error else ""
    return {
        "text": f"{text}\n{url}",
        "event": event,
        "run": {
            "id": str(run.pk),
            "agent": run.agent,
            "status": run.status,
            "step": step,
            "error": error[:2000],
            "url": url,
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        },
    }


def notify(run: Run, event: str, step: int) -> WebhookDelivery | None:
    """Make the run's delivery for this event (once) and ask a worker to send it."""
    if not enabled():
        return None
    try:
        with transaction.atomic():
            delivery = WebhookDelivery.objects.create(
                run=run, event=event, step=step, payload=payload(run, event, step)
            )
    except IntegrityError:  # made already (by the worker, or a reconciler pass)
        return None
    ask(TASK, delivery.pk, "a webhook delivery")
    return delivery


def run_failed(run_id: Any) -> None:
    """The worker's call as a run fails (its failure is committed)."""
    run = Run.objects.get(pk=run_id)
    notify(run, RUN_FAILED, run.next_step - 1)


def deliver(delivery_id: Any) -> float | None:
    """One attempt: POST it, unless delivered, given up or held by another sender.

    Returns the seconds until the next attempt when this one failed, else None.
    """
    now = timezone.now()
    timeout = settings.AGENTRUN_WEBHOOK_TIMEOUT
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    # Due (a second message for it, sent by the reconciler, does not make it early).
    due = Q(next_attempt_at__lte=now + timedelta(seconds=1))
    claimed = (
        WebhookDelivery.objects.filter(pk=delivery_id, status=DeliveryStatus.PENDING)
        .filter(free, due)
        .update(claimed_until=now + timedelta(seconds=timeout + 30))
    )
    if not claimed:
        return None
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    error = _post(delivery, timeout)
    attempts = delivery.attempts + 1
    if error is None:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.DELIVERED,
            attempts=attempts,
            delivered_at=timezone.now(),
            last_error="",
            claimed_until=None,
        )
        return None
    if attempts >= settings.AGENTRUN_WEBHOOK_MAX_ATTEMPTS:
        log.warning("webhook %s: gave up after %d attempts: %s", delivery.pk, attempts, error)
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.GAVE_UP, attempts=attempts, last_error=error, claimed_until=None
        )
        return None
    delay = min(settings.AGENTRUN_WEBHOOK_RETRY_SECONDS * 2 ** (attempts - 1), 3600.0)
    log.info("webhook %s: attempt %d failed (%s); again in %.0f s", delivery.pk, attempts, error, delay)  # fmt: skip
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts,
        last_error=error,
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
        claimed_until=None,
    )
    return delay


def _post(delivery: WebhookDelivery, timeout: float) -> str | None:
    """None when the receiver took it (2xx), else what went wrong."""
    body = json.dumps(delivery.payload, ensure_ascii=False).encode()
    timestamp = str(int(time.time()))
    request = urllib.request.Request(  # noqa: S310 — the URL is checked to be http(s)
        settings.AGENTRUN_WEBHOOK_URL,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "agentrun-webhook",
            "X-Agentrun-Event": delivery.event,
            "X-Agentrun-Delivery": str(delivery.pk),
            "X-Agentrun-Timestamp": timestamp,
            "X-Agentrun-Signature": sign(body, timestamp, settings.AGENTRUN_WEBHOOK_SECRET),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"[:500]


def sweep() -> dict[str, int]:
    """The reconciler's part: notify failures and crashed steps nobody notified, and send
    again the deliveries that are overdue (their retry message was lost)."""
    if not enabled():
        return {"notified": 0, "resent": 0}
    now = timezone.now()
    notified = 0
    local = Run.objects.filter(imported_at__isnull=True)
    # Failed lately (through the run_purge_candidates index: a pinned run is pinned by
    # someone who knows), or waiting on a step that kept crashing (active runs are few).
    failed = local.filter(
        status=RunStatus.FAILED,
        finished_at__gte=now - LOOK_BACK,
        purged_at__isnull=True,
        pinned_at__isnull=True,
    )
    crashed = local.filter(status=RunStatus.WAITING, wait_reason=WaitReason.CRASHED)
    stuck: list[Run] = []
    if settings.AGENTRUN_WEBHOOK_STUCK_MINUTES > 0:
        # Not ended, and not changed for that long (an approval nobody gives, a run no
        # worker takes, a backoff that keeps failing). Active runs are few.
        cutoff = now - timedelta(minutes=settings.AGENTRUN_WEBHOOK_STUCK_MINUTES)
        stuck = list(local.active().filter(updated_at__lt=cutoff).exclude(pk__in=crashed))
    done = set(
        WebhookDelivery.objects.filter(created_at__gte=now - 2 * LOOK_BACK).values_list(
            "run_id", "event", "step"
        )
    )
    for run, event in [
        *((r, RUN_FAILED) for r in failed),
        *((r, STEP_CRASHED) for r in crashed),
        *((r, RUN_STUCK) for r in stuck),
    ]:
        step = run.next_step - 1 if event == RUN_FAILED else run.next_step
        if (run.pk, event, step) not in done and notify(run, event, step) is not None:
            notified += 1
    overdue = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING,
        next_attempt_at__lt=now - timedelta(seconds=settings.AGENTRUN_RECONCILE_EVERY),
    ).filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
    resent = 0
    for pk in overdue.values_list("pk", flat=True)[:100]:
        ask(TASK, pk, "a webhook delivery")
        resent += 1
    return {"notified": notified, "resent": resent}
