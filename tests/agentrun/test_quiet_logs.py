"""Log lines: a reconciler pass that did nothing is DEBUG, one that acted is INFO; Celery's
routine lines about the reconciler are DEBUG; the filesystem broker draws no kombu warning."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu import Connection

from agentrun.celery import app as celery_app
from agentrun.engine.reconcile import reconcile_once
from agentrun.infra.logs import QuietRoutineTasks
from agentrun.models import Run
from tests.base import make_run


def record(name: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


@pytest.mark.django_db
def test_an_idle_reconciler_pass_logs_at_debug_and_one_that_acts_at_info(
    caplog, settings, monkeypatch
):
    caplog.set_level(logging.DEBUG, logger="agentrun.engine.reconcile")
    reconcile_once()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "reconciler: re-enqueued 0 run(s), compensated 0 call(s)")
    ]

    caplog.clear()
    run = make_run()
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    settings.AGENTRUN_ENQUEUE = True
    monkeypatch.setattr(celery_app, "send_task", lambda *a, **k: None)
    reconcile_once()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "reconciler: re-enqueued 1 run(s), compensated 0 call(s)")
    ]


@pytest.mark.parametrize(
    "logger, msg, args",
    [
        ("celery.beat", "Scheduler: Sending due task %s (%s)", ("reconcile", "agentrun.reconcile")),
        ("celery.worker.strategy", "Task %s[%s] received", ("agentrun.reconcile", "abc")),
        ("celery.app.trace", "Task %s[%s] succeeded", ("agentrun.reconcile", "abc")),
    ],
)
def test_celerys_routine_lines_about_the_reconciler_are_debug(logger, msg, args):
    quiet = QuietRoutineTasks()
    line = record(logger, logging.INFO, msg, *args)
    logging.getLogger(logger).setLevel(logging.INFO)
    try:
        assert quiet.filter(line) is False
        assert line.levelname == "DEBUG"
        # Shown when that logger is set to DEBUG (LOG_LEVEL=DEBUG), as a DEBUG line.
        logging.getLogger(logger).setLevel(logging.DEBUG)
        assert quiet.filter(record(logger, logging.INFO, msg, *args)) is True
    finally:
        logging.getLogger(logger).setLevel(logging.NOTSET)


def test_other_tasks_and_the_reconcilers_failures_keep_their_level():
    quiet = QuietRoutineTasks()
    step = record("celery.app.trace", logging.INFO, "Task %s[x] succeeded", "agentrun.execute_step")
    assert quiet.filter(step) is True and step.levelname == "INFO"
    failed = record("celery.app.trace", logging.ERROR, "Task %s[x] raised", "agentrun.reconcile")
    assert quiet.filter(failed) is True and failed.levelname == "ERROR"


def test_the_handler_of_the_logging_settings_has_the_filter(settings):
    assert settings.LOGGING["handlers"]["console"]["filters"] == ["quiet_routine_tasks"]
    assert any(
        isinstance(f, QuietRoutineTasks) for h in logging.getLogger().handlers for f in h.filters
    )


def test_the_filesystem_broker_url_draws_no_hostname_warning(caplog, tmp_path):
    assert celery_app  # the app maps filesystem:// to agentrun.infra.broker.Transport
    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "control_folder": folder}
    with (
        caplog.at_level(logging.WARNING, logger="kombu.connection"),
        Connection("filesystem://", transport_options=options) as conn,
    ):
        assert type(conn.transport).__module__ == "agentrun.infra.broker"
        conn.info()
        with conn.SimpleQueue("q") as queue:  # and it still carries messages
            queue.put({"hello": 1})
            assert queue.get(timeout=5).payload == {"hello": 1}
    assert not [r for r in caplog.records if r.name.startswith("kombu")]
