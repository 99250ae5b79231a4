"""The management commands: startrun, adduser, apitoken, reconcile."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from agentrun.celery import app as celery_app
from agentrun.management.commands import startrun
from agentrun.models import Event, Run
from agentrun.security.roles import role_of
from tests.base import PASSWORD, calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db


def run_command(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def counts():
    return Run.objects.count(), Event.objects.count()


# --- startrun ---------------------------------------------------------------------


def test_startrun_prints_the_id_of_the_queued_run():
    out = run_command("startrun", "scripted", "--input", json.dumps(script(final("hi"))))

    run = Run.objects.get()
    assert out.strip() == str(run.pk)
    assert run.status == "queued"
    assert run.input == script(final("hi"))


def test_startrun_reads_the_input_from_a_file(tmp_path):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(script(final("from a file"))))

    out = run_command("startrun", "scripted", "--input", f"@{path}")

    assert Run.objects.get(pk=out.strip()).input["steps"] == [final("from a file")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["nobody", "--input", '{"goal": "g", "steps": [{"final": "x"}]}'],
            "unknown agent 'nobody'",
        ),
        (["scripted", "--input", '{"goal": "g", "steps": []}'], "steps must be a non-empty list"),
        (
            ["scripted", "--input", '{"goal": "g", "steps": [{"calls": [], "final": "x"}]}'],
            "needs exactly one of calls or final",
        ),
        (["scripted", "--input", '{"goal": "g",'], "not valid JSON"),
        (["scripted", "--input", '{"goal": "\\u0000", "steps": [{"final": "x"}]}'], "NUL"),
        (["scripted", "--input", "[1]"], "input must be a JSON object"),
        (["scripted", "--input", "@/nonexistent/input.json"], "can't read input file"),
    ],
)
def test_startrun_refuses_bad_input_and_stores_nothing(args, message):
    before = counts()

    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run_command("startrun", *args)

    assert counts() == before


def driving_sleep(monkeypatch):
    """Instead of sleeping between polls, run the queued steps (there's no worker in tests)."""

    def sleep(seconds):
        for run in Run.objects.filter(status__in=("queued", "running")):
            drive(run)

    monkeypatch.setattr(startrun.time, "sleep", sleep)


def wait_for(*args):
    out = StringIO()
    code = 0
    try:
        call_command(
            "startrun",
            "scripted",
            "--wait",
            "--timeout",
            "5",
            "--input",
            json.dumps(script(*args)),
            stdout=out,
        )
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def test_startrun_wait_prints_succeeded_and_exits_0(monkeypatch):
    driving_sleep(monkeypatch)

    code, lines = wait_for(calls({"tool": "echo", "args": {}}), final())

    assert code == 0
    assert lines == [str(Run.objects.get().pk), "succeeded", "answer: done"]


def test_startrun_wait_prints_the_error_of_a_failed_run_and_exits_1(monkeypatch):
    driving_sleep(monkeypatch)

    code, lines = wait_for(calls({"tool": "fail", "args": {"message": "card declined"}}))

    assert code == 1
    assert lines[1] == "failed: card declined"


def test_startrun_wait_stops_at_an_approval_and_exits_2(monkeypatch):
    driving_sleep(monkeypatch)

    code, lines = wait_for(calls({"tool": "echo", "args": {}, "approval": True}), final())

    assert code == 2
    assert lines[1] == "waiting (approval): step 1: an operator approves or rejects a call"


def test_startrun_wait_gives_up_after_the_timeout_and_exits_3():
    out = StringIO()
    with pytest.raises(SystemExit) as exc:
        call_command(
            "startrun",
            "scripted",
            "--wait",
            "--timeout",
            "0.2",
            "--input",
            json.dumps(script(final())),
            stdout=out,
        )

    assert exc.value.code == 3
    line = out.getvalue().splitlines()[1]
    assert line.startswith("timeout: still queued after 0.2s: queued for ")
    assert line.endswith(
        "no worker has claimed step 1 yet. Is a worker running (`celery -A agentrun worker`, "
        "or `make up`) on this database and broker?"
    )


# --- adduser and apitoken -----------------------------------------------------------


def test_adduser_creates_a_user_who_can_log_in_with_the_role():
    out = run_command("adduser", "nina", "--role", "operator", "--password", "s3cret pass")

    assert out.strip() == "created nina (operator)"
    user = authenticate(username="nina", password="s3cret pass")
    assert user is not None and role_of(user) == "operator"


def test_adduser_updates_an_existing_users_role_and_password():
    run_command("adduser", "nina", "--role", "operator", "--password", "old")

    out = run_command("adduser", "nina", "--role", "viewer", "--password", "new")

    assert out.strip() == "updated nina (viewer)"
    assert authenticate(username="nina", password="old") is None
    assert role_of(authenticate(username="nina", password="new")) == "viewer"


def test_adduser_refuses_an_unknown_role():
    with pytest.raises(CommandError, match="invalid choice: 'root'"):
        run_command("adduser", "nina", "--role", "root", "--password", "x")
    assert authenticate(username="nina", password="x") is None


def test_apitoken_prints_a_token_that_authenticates_to_the_api():
    make_people()

    token = run_command("apitoken", "olga").strip()

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    body = {"agent": "scripted", "input": script(final())}
    response = client.post("/api/runs", body, content_type="application/json")
    assert response.status_code == 201
    assert Run.objects.get().created_by.username == "olga"


def test_apitoken_refuses_an_unknown_user():
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        run_command("apitoken", "ghost")


def test_adduser_then_login_with_the_password_works():
    run_command("adduser", "vera", "--role", "viewer", "--password", PASSWORD)
    client = Client()
    assert client.login(username="vera", password=PASSWORD)
    assert client.get("/api/runs").status_code == 200


# --- reconcile ------------------------------------------------------------------------


def test_reconcile_reports_a_pass_with_nothing_to_do():
    assert run_command("reconcile").strip() == "enqueued 0 run(s), compensated 0 call(s)"


def test_reconcile_re_enqueues_a_run_whose_wake_up_was_lost(
    settings, monkeypatch, django_capture_on_commit_callbacks
):
    run = make_run()
    Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    settings.AGENTRUN_ENQUEUE = True
    sent = []
    monkeypatch.setattr(
        celery_app, "send_task", lambda name, args, countdown=None: sent.append((name, args))
    )

    with django_capture_on_commit_callbacks(execute=True):
        out = run_command("reconcile")

    assert out.strip() == "enqueued 1 run(s), compensated 0 call(s)"
    assert sent == [("agentrun.execute_step", (str(run.pk), 1))]


def test_startrun_says_where_the_run_is_and_who_started_it(settings):
    operator = make_people()["operator"]
    settings.AGENTRUN_SITE_URL = "https://agentrun.example"
    out, err = StringIO(), StringIO()
    call_command(
        "startrun", "scripted", "--input", json.dumps(script(final("hi"))),
        "--user", operator.username, stdout=out, stderr=err,
    )  # fmt: skip
    run = Run.objects.get()
    assert err.getvalue().strip() == f"https://agentrun.example/runs/{run.pk}/"
    assert run.created_by == operator
    with pytest.raises(CommandError, match="needs the operator role"):
        call_command(
            "startrun", "scripted", "--input", "{}", "--user", "victor", stdout=out, stderr=err
        )


def test_a_failed_step_says_why_in_the_worker_log(caplog):
    run = make_run(script(calls({"tool": "fail", "args": {"message": "card declined"}})))
    with caplog.at_level("WARNING", logger="agentrun.engine.commit"):
        drive(run)
    assert [r.getMessage() for r in caplog.records] == [
        f"step 1 of run {run.pk} failed: ToolError: card declined"
    ]
