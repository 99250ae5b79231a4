import pytest
from django.test import Client

from agentrun.celery import app as celery_app
from agentrun.models import ApiToken
from tests.base import make_people
from tests.workers import Worker


@pytest.fixture
def start_worker(tmp_path, settings):
    """Start real worker processes; the test process enqueues for them."""
    settings.AGENTRUN_ENQUEUE = True
    # Messages left by earlier tests would only slow the worker down.
    celery_app.control.purge()
    started: list[Worker] = []

    def start(**kwargs) -> Worker:
        worker = Worker(tmp_path, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def people(db):
    """The named people of tests.base (a module may define its own)."""
    return make_people()


@pytest.fixture
def viewer(people):
    """An API client with the viewer's token."""
    return Client(HTTP_AUTHORIZATION=f"Bearer {ApiToken.issue(people['viewer'])}")
