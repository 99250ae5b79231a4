"""`manage.py replay` (batches from the command line) and `manage.py replaytest` with the
pytest helper (an incident's archive as a regression test)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from agentrun.lifecycle import archive
from agentrun.models import ReplayBatch, Run
from agentrun.testing import assert_replays, replay_archive
from tests.base import make_people
from tests.fleet.scenario import deploy_v2, incident, run_batch
from tests.workers import ROOT, worker_env

pytestmark = pytest.mark.django_db

INCIDENT = ROOT / "tests" / "fleet" / "empty-order.agentrun.jsonl.gz"


def replay(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("replay", *args, stdout=out, stderr=err)
    return out.getvalue()


def test_a_dry_run_lists_each_run_and_its_fork_point(on_v1):
    incident(n_failing=2, n_fine=1)
    out = replay("--filter", "agent=refunds", "--from", "before-failure", "--dry-run")
    assert "2 run(s) to replay before its first failed step, 1 skipped; mode sandbox" in out
    assert out.count("step 2") == 2 and "skipped: no failed step" in out
    assert ReplayBatch.objects.count() == 0


def test_replay_status_and_promote_from_the_command_line(on_v1, monkeypatch):
    operator = make_people()["operator"]
    incident(n_failing=2, n_fine=0)
    deploy_v2(monkeypatch)
    out = replay(
        "--filter", "status=failed", "--filter", "agent=refunds", "--version", "v2",
        "--name", "refunds fixed", "--user", operator.username,
    )  # fmt: skip
    batch = ReplayBatch.objects.get()
    assert out.startswith(f"batch {batch.pk} (refunds fixed): sandbox")
    assert batch.created_by == operator and batch.version == "v2"
    run_batch(batch)
    assert "fixed: 2" in replay("--status", str(batch.pk)[:8])
    preview = replay("--promote", str(batch.pk), "--dry-run")
    assert "side effects it lets happen: ledger_write ×2" in preview
    with pytest.raises(CommandError, match="--confirm-live: a live batch"):
        replay("--promote", str(batch.pk))
    replay("--promote", str(batch.pk), "--confirm-live")
    assert ReplayBatch.objects.filter(mode="live", promoted_from=batch).count() == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--filter", "colour=red"], "--filter: filter: unknown filter field 'colour'"),
        (["--filter", "status"], "write it as name=value"),
        (["--version", ""], "--version: a version can't be empty"),
        (["--version", "x" * 65], "--version: a version is at most 64"),
        (["--from", "middle"], "--from: from must be"),
        (["--filter", "error=nothing like it"], "the filter selects no run"),
        (["--filter", "agent=a"], "--filter agent is given twice"),
        ([], "--name: a batch needs a name"),
        (["--status", "zz"], "not a batch id"),
        (["--user", "victor"], "needs the operator role"),
    ],
)
def test_bad_input_is_a_clear_error_and_creates_nothing(on_v1, args, message):
    make_people()
    incident(n_failing=1, n_fine=0)
    base = [] if "--status" in args else ["--filter", "agent=refunds"]
    if "--name" not in args and "--status" not in args and args != []:
        base += ["--name", "x"]
    with pytest.raises(CommandError, match=message):
        replay(*base, *args)
    assert ReplayBatch.objects.count() == 0


def test_an_incident_archive_replays_fixed_on_the_fixed_code(on_v1, monkeypatch):
    deploy_v2(monkeypatch)
    (done,) = assert_replays([INCIDENT], expect="fixed")
    assert done.run.imported_at is not None and done.step == 2
    assert done.fork.status == "succeeded" and done.fork.parent_id == done.run.pk


def test_the_helper_fails_while_the_bug_is_still_there(on_v1):
    with pytest.raises(AssertionError, match="still_failing"):
        assert_replays([INCIDENT], expect="fixed")


def test_an_archive_from_before_code_versions_imports_without_them(on_v1):
    from tests.agentrun.archives import pack, records

    recs = records(INCIDENT.read_bytes())
    for r in recs:
        for name in ("created_version", "target_version", "code_version"):
            r.pop(name, None)
    (run,) = archive.import_archive(lambda: io.BytesIO(pack(recs)), user=None)
    assert (run.created_version, run.code_version) == ("", "")
    assert set(run.steps.values_list("code_version", flat=True)) == {""}


def test_the_recorded_code_version_travels_with_the_archive(on_v1):
    (replayed,) = replay_archive(INCIDENT)
    assert replayed.run.code_version == "v1"
    assert set(
        Run.objects.get(pk=replayed.run.pk).steps.values_list("code_version", flat=True)
    ) == {"v1"}


@pytest.mark.parametrize(
    "module, status, said",
    [("tests.fleet.refunds_v2", 0, "ok    "), ("tests.fleet.refunds_v1", 1, "FAIL  ")],
)
def test_replaytest_passes_on_the_fix_and_fails_on_the_bug(tmp_path, module, status, said):
    env = worker_env(AGENTRUN_AGENT_MODULES=module, AGENTRUN_VAR_DIR=str(tmp_path))
    env.pop("DATABASE_URL")  # its own throwaway database, whatever the tests use
    done = subprocess.run(
        [sys.executable, "manage.py", "replaytest", str(INCIDENT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == status, done.stdout + done.stderr
    assert done.stdout.startswith(said) and "empty-order.agentrun.jsonl.gz: run" in done.stdout
    assert ("1 of 1 replays fixed" if status == 0 else "0 of 1 replays fixed") in done.stdout
