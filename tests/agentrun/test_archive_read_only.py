"""An imported run is read-only: never claimed, resumed or reconciled; no operator action
applies to it (API, pages); it can be forked, in sandbox and recorded modes."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from agentrun import engine
from agentrun.engine.reconcile import reconcile_once
from agentrun.lifecycle.services import fork_run
from agentrun.models import ApiToken, Run, Step, ToolCall
from agentrun.store import snapshots
from tests.agentrun import archives
from tests.agentrun.test_archive_export_import import forget
from tests.base import PASSWORD, calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

NEEDS_APPROVAL = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls({"tool": "ledger_write", "args": {"account": "a", "amount": 1}, "approval": True}),
    final("paid"),
)


@pytest.fixture
def people():
    return make_people()


def imported(run: Run) -> Run:
    data = archives.export_bytes(run)
    forget(run)
    (run,) = archives.import_bytes(data)
    return run


def test_an_imported_run_is_never_claimed_nor_re_enqueued(people):
    half_done = drive(make_run(archives.STEPS), max_steps=2)
    assert half_done.status == "running" and half_done.next_step == 3
    run = imported(half_done)
    assert (run.status, run.lease_owner, run.lease_expires_at) == ("running", "", None)
    assert not run.is_active  # nothing will change it here
    control = make_run()  # a local run whose wake-up was lost

    result = reconcile_once(grace_seconds=0)

    assert result["enqueued"] == 1  # the local run only
    assert engine.execute_step(run.pk, 3).status == "not_claimed"
    assert engine.execute_step(control.pk, 1).status != "not_claimed"
    assert not Step.objects.filter(run=run, number=3).exists()
    assert Run.objects.get(pk=run.pk).next_step == 3


def test_the_reconciler_compensates_nothing_of_an_imported_run(people):
    run = archives.finished_run()
    recs = archives.records(archives.export_bytes(run))
    forget(run)
    # Exported while its hybrid call waited to be compensated.
    next(r for r in recs if r["type"] == "run")["status"] = "failed"
    recs[0]["runs"][0]["status"] = "failed"
    (run,) = archives.import_bytes(archives.pack(recs))
    reserve = ToolCall.objects.get(run=run, tool="reserve")
    assert reserve.status == "ok"

    assert reconcile_once(grace_seconds=0)["compensated"] == 0
    assert ToolCall.objects.get(pk=reserve.pk).status == "ok"


@pytest.fixture
def waiting(people):
    """A run waiting for an approval, imported."""
    run = drive(make_run(NEEDS_APPROVAL))
    assert (run.status, run.wait_reason) == ("waiting", "approval")
    return imported(run)


@pytest.mark.parametrize(
    "action, body",
    [("cancel", {}), ("approve", {"decision": "approve"}), ("retry", {})],
)
def test_the_api_refuses_every_action_on_an_imported_run(people, waiting, action, body):
    token = ApiToken.issue(people["operator"])
    client = Client(headers={"Authorization": f"Bearer {token}"})
    response = client.post(
        f"/api/runs/{waiting.pk}/{action}", data=body, content_type="application/json"
    )
    assert response.status_code == 409
    assert "imported from an archive and is read-only" in response.json()["detail"]
    run = Run.objects.get(pk=waiting.pk)
    assert (run.status, run.wait_reason) == ("waiting", "approval")
    assert client.get(f"/api/runs/{waiting.pk}").json()["imported_at"] is not None


def test_the_run_page_offers_no_action_and_refuses_one_posted(people, waiting):
    client = Client()
    assert client.login(username="olga", password=PASSWORD)
    page = client.get(f"/runs/{waiting.pk}/").content.decode()
    assert "imported · read-only" in page
    assert 'data-action="approve"' not in page and 'data-action="cancel"' not in page
    assert 'data-action="export"' in page
    assert 'hx-trigger="every 2s"' not in page  # nothing to poll for
    response = client.post(f"/runs/{waiting.pk}/approval/", {"decision": "approve"}, follow=True)
    assert "read-only" in response.content.decode()
    response = client.post(f"/runs/{waiting.pk}/cancel/", {"reason": "x"}, follow=True)
    assert "Not cancelled: this run was imported" in response.content.decode()
    assert Run.objects.get(pk=waiting.pk).status == "waiting"


def test_an_imported_run_is_not_on_the_now_page(people, waiting):
    from agentrun.engine import inflight

    assert inflight.counts(timezone.now()).get("approval", 0) == 0
    local = drive(make_run(NEEDS_APPROVAL))
    assert local.wait_reason == "approval"
    assert inflight.counts(timezone.now())["approval"] == 1


@pytest.mark.parametrize("mode", ["sandbox", "recorded"])
def test_a_fork_of_an_imported_run_runs_here(people, mode):
    source = imported(archives.finished_run())
    last = snapshots.get(source.pk, 4, "post").hash
    fork = drive(fork_run(source, step=1, at="pre", mode=mode, user=people["operator"]))
    assert fork.status == "succeeded", fork.error
    assert fork.imported_at is None and fork.parent_id == source.pk
    statuses = {tc.status for tc in ToolCall.objects.filter(run=fork)}
    if mode == "recorded":  # the imported decisions and results, replayed to the same end
        assert statuses == {"replayed"} and fork.divergence_step is None
        assert snapshots.get(fork.pk, 4, "post").hash == last
    else:  # the write and hybrid calls are skipped, the reads run
        assert statuses == {"ok", "skipped"}
    assert Run.objects.get(pk=source.pk).status == "succeeded"  # the parent never changes


def test_a_fork_of_an_edited_state_from_an_imported_fork(people):
    parent = archives.finished_run()
    child = archives.edited_fork(parent)
    data = archives.export_bytes(child)  # without its parent
    forget(child)
    (child,) = archives.import_bytes(data)
    state = snapshots.load(child.pk, 3, "pre")
    state["memory"]["goal"] = "again"
    grandchild = drive(
        fork_run(child, step=3, at="pre", state=state, mode="sandbox", user=people["operator"])
    )
    assert grandchild.status == "succeeded"
    assert snapshots.load(grandchild.pk, 4, "post")["memory"]["goal"] == "again"


def test_retention_keeps_an_imported_run_however_old(people, settings):
    from datetime import timedelta

    from agentrun.lifecycle import retention

    old = archives.finished_run()
    Run.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=400))
    run = imported(Run.objects.get(pk=old.pk))
    control = archives.finished_run()
    Run.objects.filter(pk=control.pk).update(finished_at=timezone.now() - timedelta(days=400))
    cutoff = timezone.now() - timedelta(days=30)
    assert list(retention.candidates(cutoff).values_list("pk", flat=True)) == [control.pk]
    assert retention.purge_after(Run.objects.get(pk=run.pk)) is None
