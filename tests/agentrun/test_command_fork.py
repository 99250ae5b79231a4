"""`manage.py fork RUN_ID STEP --at pre|post --mode M [--state] [--reason] [--confirm-live] [--user]`."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agentrun.models import Event, LedgerEntry, Run, Snapshot, Step, ToolCall
from agentrun.store import snapshots
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

SIDE_EFFECTS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    calls({"tool": "notify", "args": {"to": "ana", "body": "booked"}}),
    final("booked"),
)


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def parent(people):
    return drive(make_run(SIDE_EFFECTS))


def stored() -> tuple[int, int, int, int]:
    return (
        Run.objects.count(),
        Event.objects.count(),
        Snapshot.objects.count(),
        Step.objects.count(),
    )


def fork(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("fork", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def forked(out: str) -> Run:
    """The run whose id is the command's only output."""
    return Run.objects.get(pk=out.strip())


def test_it_prints_only_the_new_runs_id(parent, people):
    out, err = fork(
        str(parent.pk), "2", "--at", "pre", "--mode", "sandbox", "--reason", "look again",
        "--user", "olga",
    )  # fmt: skip

    assert out.strip() == str(uuid.UUID(out.strip())) and out.count("\n") == 1
    assert err == ""
    run = forked(out)
    assert (run.parent, run.mode, run.first_step) == (parent, "sandbox", 2)
    assert (run.forked_from.step, run.forked_from.at, run.created_by) == (
        2,
        "pre",
        people["operator"],
    )
    event = Event.objects.get(run=run, kind="run_forked")
    assert (event.actor, event.reason) == ("olga", "look again")
    assert drive(run).status == "succeeded"
    assert sorted(run.steps.values_list("number", flat=True)) == [2, 3, 4]


def test_without_a_user_the_fork_is_recorded_as_the_system(parent):
    run = forked(fork(str(parent.pk), "1", "--at", "post", "--mode", "recorded")[0])
    assert (run.first_step, run.mode, run.created_by) == (2, "recorded", None)
    assert Event.objects.get(run=run, kind="run_forked").actor == "system"


def test_the_edited_state_comes_from_a_file_or_the_command_line(parent, tmp_path):
    state = snapshots.load(parent.pk, 3, "pre")
    state["memory"]["goal"] = "a different goal"
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state), encoding="utf-8")

    from_file = forked(fork(str(parent.pk), "3", "--at", "pre", "--mode", "sandbox",
                            "--state", f"@{path}")[0])  # fmt: skip
    inline = forked(fork(str(parent.pk), "3", "--at", "pre", "--mode", "sandbox",
                         "--state", json.dumps(state))[0])  # fmt: skip

    for run in (from_file, inline):
        assert snapshots.load(run.pk, 3, "pre") == state
        edits = Event.objects.get(run=run, kind="run_forked").payload["edits"]
        assert edits == [["set", ["memory", "goal"], "a different goal"]]


def test_a_sandbox_fork_runs_no_side_effect(parent):
    run = drive(forked(fork(str(parent.pk), "1", "--at", "pre", "--mode", "sandbox")[0]))
    assert run.status == "succeeded"
    assert LedgerEntry.objects.count() == 1  # the parent's
    statuses = ToolCall.objects.filter(run=run, kind__in=("write", "hybrid"))
    assert set(statuses.values_list("status", flat=True)) == {"skipped"}


def test_a_live_fork_without_confirmation_lists_what_it_would_redo_and_refuses(parent):
    counts = stored()
    out, err = StringIO(), StringIO()

    with pytest.raises(CommandError, match="--confirm-live") as refused:
        call_command(
            "fork", str(parent.pk), "2", "--at", "pre", "--mode", "live", stdout=out, stderr=err
        )

    assert "nothing was created" in str(refused.value)
    assert out.getvalue() == ""
    listing = err.getvalue()
    assert "would run these 3 write/hybrid call(s)" in listing
    for tc in ToolCall.objects.filter(run=parent, kind__in=("write", "hybrid")):
        assert tc.tool in listing and tc.idempotency_key in listing
    assert '"account": "acme"' in listing
    assert "echo" not in listing
    assert stored() == counts


def test_a_confirmed_live_fork_runs_for_real(parent):
    out, err = fork(
        str(parent.pk), "2", "--at", "pre", "--mode", "live", "--confirm-live", "--user", "olga"
    )
    run = drive(forked(out))

    assert "confirmed: 3 write/hybrid call(s)" in err
    assert run.status == "succeeded" and run.mode == "live"
    assert LedgerEntry.objects.filter(run=run).count() == 1
    assert LedgerEntry.objects.filter(run=parent).count() == 1


def test_a_live_fork_with_nothing_to_redo_needs_no_confirmation(parent):
    out, err = fork(str(parent.pk), "3", "--at", "post", "--mode", "live")
    assert forked(out).mode == "live" and err == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["{run}", "9", "--at", "pre", "--mode", "sandbox"],
                     "no pre snapshot of step 9 (steps 1..4)", id="step too big"),
        pytest.param(["{run}", "-1", "--at", "pre", "--mode", "sandbox"],
                     "no pre snapshot of step -1", id="step negative"),
        pytest.param(["{run}", "99999999999999", "--at", "pre", "--mode", "sandbox"],
                     "out of range", id="step huge"),
        pytest.param(["{run}", "two", "--at", "pre", "--mode", "sandbox"],
                     "step must be an integer, not 'two'", id="step not a number"),
        pytest.param(["{run}", "4", "--at", "post", "--mode", "sandbox"],
                     "nothing would run", id="after the end"),
        pytest.param(["{run}", "2", "--at", "middle", "--mode", "sandbox"],
                     'at must be "pre" or "post"', id="bad at"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "yolo"],
                     "mode must be one of sandbox, recorded, live", id="bad mode"),
        pytest.param(["{run}", "2", "--at", "pre"], "--mode", id="no mode"),
        pytest.param(["{run}", "2", "--mode", "sandbox"], "--at", id="no at"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox", "--state", "{"],
                     "--state: not valid JSON", id="state not JSON"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox", "--state", "[]"],
                     "state", id="state a list"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox",
                      "--state", '{"phase": "bogus"}'], "state: phase", id="phase bogus"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox",
                      "--state", "@/nonexistent/state.json"],
                     "can't read the state file", id="state file missing"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox", "--user", "nobody"],
                     "no active user named 'nobody'", id="unknown user"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox", "--user", "victor"],
                     "needs the operator role; 'victor' is a viewer", id="viewer"),
        pytest.param(["{run}", "2", "--at", "pre", "--mode", "sandbox", "--user", "oscar"],
                     "'oscar' is a user without a role", id="no role"),
        pytest.param([str(uuid.uuid4()), "2", "--at", "pre", "--mode", "sandbox"],
                     "no run", id="unknown run"),
        pytest.param(["not-a-uuid", "2", "--at", "pre", "--mode", "sandbox"],
                     "not a valid run id", id="bad UUID"),
    ],
)  # fmt: skip
def test_a_bad_fork_is_a_command_error_and_creates_nothing(parent, people, args, message):
    counts = stored()
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command(
            "fork",
            *[str(parent.pk) if a == "{run}" else a for a in args],
            stdout=out,
            stderr=StringIO(),
        )
    assert message in str(refused.value)
    assert out.getvalue() == ""
    assert stored() == counts


@pytest.mark.django_db
def test_a_fork_onto_a_code_version_from_the_command_line():
    run = drive(make_run())
    out = StringIO()
    call_command("fork", str(run.pk), "1", "--at", "pre", "--mode", "sandbox",
                 "--version", "v2", stdout=out)  # fmt: skip
    assert Run.objects.get(pk=out.getvalue().strip()).target_version == "v2"
    with pytest.raises(CommandError, match="a version is letters"):
        call_command("fork", str(run.pk), "1", "--at", "pre", "--mode", "sandbox",
                     "--version", "no spaces please", stdout=out)  # fmt: skip
