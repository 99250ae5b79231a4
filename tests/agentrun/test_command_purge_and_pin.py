"""`manage.py purge [--older-than 30d] [--dry-run]` and `manage.py pin RUN_ID --reason R --user U`."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agentrun.models import Event, Run, Snapshot
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

READS = script(calls({"tool": "echo", "args": {"n": 1}}), final())


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def old_run():
    run = drive(make_run(READS))
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=3))
    return run


def run_command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("bad", ["30", "thirty days", "-1d", "0h", "2w", "1.5d", ""])
def test_a_bad_duration_is_a_command_error_and_purges_nothing(old_run, bad):
    with pytest.raises(CommandError, match="--older-than"):
        run_command("purge", "--older-than", bad)
    assert Snapshot.objects.filter(run=old_run).exists()


@pytest.mark.parametrize("bad", ["0", "ten", "-5", "1000001"])
def test_a_bad_batch_is_a_command_error(old_run, bad):
    with pytest.raises(CommandError, match="--batch"):
        run_command("purge", "--older-than", "1d", "--batch", bad)
    assert Snapshot.objects.filter(run=old_run).exists()


def test_a_dry_run_says_what_would_go_and_a_purge_does_it(old_run):
    recent = drive(make_run(READS))
    out = run_command("purge", "--older-than", "2d", "--dry-run")
    assert (
        out.startswith("would purge 1 run(s)") and "2 step(s), 4 snapshot(s), 1 read call(s)" in out
    )
    assert Snapshot.objects.filter(run=old_run).count() == 4
    assert not Event.objects.filter(kind="runs_purged").exists()
    out = run_command("purge", "--older-than", "48h", "--batch", "1")
    assert out.startswith("purged 1 run(s)")
    assert not Snapshot.objects.filter(run=old_run).exists()
    assert Snapshot.objects.filter(run=recent).count() == 4
    assert Event.objects.get(kind="runs_purged").actor == "manage.py purge"
    assert run_command("purge", "--older-than", "1d").startswith("purged 0 run(s)")


def test_without_older_than_it_takes_the_configured_retention(settings, old_run):
    settings.AGENTRUN_RETENTION_DAYS = 4
    assert run_command("purge").startswith("purged 0 run(s)")
    settings.AGENTRUN_RETENTION_DAYS = 2
    assert run_command("purge").startswith("purged 1 run(s)")
    settings.AGENTRUN_RETENTION_DAYS = 0
    with pytest.raises(CommandError, match="retention is off"):
        run_command("purge")


def test_an_operator_pins_and_unpins_from_the_command_line(people, old_run):
    out = run_command("pin", str(old_run.pk), "--reason", "incident #123", "--user", "olga")
    assert out.strip() == f"pinned {old_run.pk}: incident #123"
    assert run_command("purge", "--older-than", "1d").startswith("purged 0 run(s)")
    assert run_command("pin", str(old_run.pk), "--unpin", "--user", "ada").strip() == (
        f"unpinned {old_run.pk}"
    )
    kinds = list(Event.objects.filter(run=old_run, user__isnull=False).values_list("kind", "actor"))
    assert kinds == [("run_pinned", "olga"), ("run_unpinned", "ada")]
    assert run_command("purge", "--older-than", "1d").startswith("purged 1 run(s)")
    with pytest.raises(CommandError, match="purged by retention"):
        run_command("pin", str(old_run.pk), "--reason", "too late", "--user", "olga")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--user", "olga"], "needs a reason"),
        (["--reason", "   ", "--user", "olga"], "needs a reason"),
        (["--reason", "incident"], "--user"),
        (["--reason", "incident", "--user", "victor"], "pinning needs the operator role"),
        (["--reason", "incident", "--user", "nobody"], "no active user"),
        (["--unpin", "--user", "olga"], "not pinned"),
    ],
)
def test_a_bad_pin_is_a_command_error_and_changes_nothing(people, old_run, args, message):
    with pytest.raises(CommandError, match=message):
        run_command("pin", str(old_run.pk), *args)
    old_run.refresh_from_db()
    assert old_run.pinned_at is None
    assert not Event.objects.filter(kind__in=("run_pinned", "run_unpinned")).exists()


def test_pinning_an_unknown_run_is_a_command_error(people):
    for run_id in ("nope", str(uuid.uuid4())):
        with pytest.raises(CommandError, match="no run|not a valid run id"):
            run_command("pin", run_id, "--reason", "x", "--user", "olga")
