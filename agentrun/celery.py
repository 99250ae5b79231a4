"""The Celery app. Settings come from Django's (CELERY_* names)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")

app = Celery("agentrun")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["agentrun"])
