"""The Celery app. Settings come from Django's (CELERY_* names)."""

import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

# "filesystem://" (the embedded default) gets the atomic-write variant.
TRANSPORT_ALIASES["filesystem"] = "agentrun.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

app = Celery("agentrun")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agentrun"])
