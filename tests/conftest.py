import pytest
from django.conf import settings


@pytest.fixture(autouse=True)
def _engine_settings(settings):
    # Tests drive the engine themselves unless they start a worker.
    settings.AGENTRUN_ENQUEUE = False
    settings.AGENTRUN_FAULTS = True
    settings.AGENTRUN_LEASE_SECONDS = 3.0
    # PBKDF2 costs about a second per user on these machines.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield


def pytest_report_header(config):
    db = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    return f"agentrun: database={db} broker={settings.CELERY_BROKER_URL.split(':', 1)[0]}"
