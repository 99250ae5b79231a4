"""Celery tasks: thin shims over functions that are tested without a broker."""

from celery import shared_task
from django.conf import settings

from agentrun import engine
from agentrun.engine import reconcile
from agentrun.lifecycle import batches
from agentrun.telemetry import metrics, tracing, webhooks


@shared_task(name="agentrun.execute_step")
def execute_step_task(run_id: str, step: int) -> str:
    return engine.execute_step(run_id, step, chain=settings.AGENTRUN_CHAIN_SECONDS).status


@shared_task(name="agentrun.reconcile")
def reconcile_task() -> dict:
    done = reconcile.reconcile_once()
    done["batches"] = batches.advance_all()  # a lost message delays a batch one pass
    done["webhooks"] = webhooks.sweep()  # failures nobody notified, retries overdue
    done["traced_again"] = tracing.emit_lost()  # spans a killed worker took with it
    metrics.count_reconciled(done)
    return done


# One attempt per message; a failed one is tried again later by Celery (and, if that
# message is lost, by the reconciler's sweep).
@shared_task(name="agentrun.webhook", bind=True, max_retries=None, acks_late=False)
def webhook_task(self, delivery_id: str) -> None:
    delay = webhooks.deliver(delivery_id)
    if delay is not None:
        raise self.retry(countdown=delay)


@shared_task(name="agentrun.batch_advance")
def batch_advance_task(batch_id: str) -> dict:
    return batches.advance(batch_id)


@shared_task(name="agentrun.purge")
def purge_task() -> dict:
    from agentrun.lifecycle import retention

    return retention.run_pass()


# Not acknowledged late: a build that took its worker down is not handed to the next one
# (a search of the run asks again).
@shared_task(name="agentrun.search_index", acks_late=False)
def search_index_task(run_id: str) -> int:
    from agentrun.store import callsearch

    return callsearch.build(run_id)


@shared_task(name="agentrun.compact", acks_late=False)
def compact_task(run_id: str) -> int:
    from agentrun.store import compaction

    return compaction.compact(run_id)
