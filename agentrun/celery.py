"""The Celery app. Settings come from Django's (CELERY_* names)."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init
from kombu.transport import TRANSPORT_ALIASES

# "filesystem://" (the embedded default) gets the atomic-write variant.
TRANSPORT_ALIASES["filesystem"] = "agentrun.broker:Transport"
# Redis: kombu's transport without a new client per command (see the module).
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = "agentrun.celery_redis:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

app = Celery("agentrun")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agentrun"])


# A task is to a worker what a request is to the web server: keep its database
# connection across tasks (a new PostgreSQL connection costs ~5 ms, a trivial step's
# worth), dropping it only when it is broken or older than CONN_MAX_AGE. Celery's own
# Django fixup would close it around every task; CELERY_DB_REUSE_MAX spaces that out.
@task_prerun.connect
@task_postrun.connect
def _close_old_connections(**_: Any) -> None:
    from django.db import close_old_connections

    close_old_connections()


# The LLM client costs ~1.5 s to import: start it when a worker starts, in the
# background (the worker is ready meanwhile), not in its first hundred steps in flight.
@worker_init.connect
def _import_the_llm_client(**_: Any) -> None:
    import importlib
    import threading

    threading.Thread(
        target=importlib.import_module, args=("openai",), name="import-openai", daemon=True
    ).start()


@worker_init.connect
def _switch_interval(**_: Any) -> None:
    import sys

    value = os.environ.get("AGENTRUN_SWITCH_INTERVAL")
    if value:
        sys.setswitchinterval(float(value))
