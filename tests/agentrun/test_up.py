"""`manage.py up`: the child commands it builds and how it supervises them.

No server or worker is started here; the supervision tests use short-lived
`python -c` children that stop within a second or two.
"""

from __future__ import annotations

import io
import signal
import sys
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agentrun.management.commands import up


def test_worker_command_runs_the_agentrun_app_with_beat_in_var():
    cmd = up.worker_command(0, beat=True, var_dir=Path("/v"), python="py")
    assert cmd[:6] == ["py", "-m", "celery", "-A", "agentrun", "worker"]
    # The pool and its concurrency come from the Celery configuration, as for users.
    assert not {"--concurrency", "-c", "--pool", "-P"} & set(cmd)
    assert "-B" in cmd
    assert cmd[cmd.index("--schedule") + 1] == "/v/celerybeat-schedule"


def test_only_the_first_worker_runs_beat_and_the_web_server_comes_last():
    children = up.child_commands(
        "127.0.0.1", 8765, 3, var_dir=Path("/v"), python="py", manage=Path("/app/manage.py")
    )
    names = [name for name, _ in children]
    assert names == ["celery worker 1 (+beat)", "celery worker 2", "celery worker 3", "web server"]
    workers = [argv for name, argv in children if name.startswith("celery")]
    assert ["-B" in argv for argv in workers] == [True, False, False]
    hostnames = {argv[argv.index("--hostname") + 1] for argv in workers}
    assert len(hostnames) == 3  # distinct node names
    assert children[-1][1] == [
        "py",
        "/app/manage.py",
        "runserver",
        "--noreload",
        "--insecure",
        "127.0.0.1:8765",
    ]


def test_ipv6_hosts_are_bracketed_and_wildcards_shown_as_loopback():
    assert up.web_command("::1", 9000, python="py", manage=Path("m"))[-1] == "[::1]:9000"
    assert up.url_for("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert up.url_for("0.0.0.0", 8000)  # noqa: S104 == "http://127.0.0.1:8000/"
    assert up.url_for("::", 8000) == "http://[::1]:8000/"


def test_children_get_the_same_environment():
    env = up.child_env({"DATABASE_URL": "postgres://x/y", "AGENTRUN_VAR_DIR": "/tmp/v"})
    assert env["DATABASE_URL"] == "postgres://x/y"
    assert env["AGENTRUN_VAR_DIR"] == "/tmp/v"
    assert env["DJANGO_SETTINGS_MODULE"] == "agentrun.settings"


def test_filesystem_broker_folders_are_under_the_var_dir(settings, tmp_path):
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(tmp_path / "q"),
        "data_folder_out": str(tmp_path / "q"),
        "processed_folder": str(tmp_path / "p"),
        "visibility_timeout": 60,
    }
    assert set(up.broker_folders()) == {tmp_path / "q", tmp_path / "p"}
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    assert up.broker_folders() == []


def test_demo_logins_are_username_role_password_rows():
    logins = up.demo_logins()
    assert logins
    for name, role, password in logins:
        assert name and password
        assert role in ("viewer", "operator", "admin")


def test_workers_must_be_positive():
    with pytest.raises(CommandError, match="--workers"):
        call_command("up", "--workers", "0")


# --- supervision, with tiny stand-in children ------------------------------------------


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SLEEPER = _py("import time\nwhile True: time.sleep(0.05)")


def _supervisor(*children: up.Child, **kw) -> tuple[up.Supervisor, io.StringIO]:
    out = io.StringIO()
    sup = up.Supervisor(list(children), out=out, **kw)
    return sup, out


def test_a_dying_child_is_reported_and_the_others_are_stopped():
    crasher = up.Child("crasher", _py("raise SystemExit(3)"))
    sup, out = _supervisor(up.Child("sleeper", SLEEPER), crasher)
    sup.start()
    try:
        assert sup.watch(poll=0.05) == 1
    finally:
        sup.stop()
    assert "crasher exited with code 3" in out.getvalue()
    assert all(not c.alive for c in sup.children)
    assert sup.children[0].proc.returncode == -signal.SIGTERM


def test_a_signal_stops_every_child_with_sigterm():
    sup, out = _supervisor(up.Child("a", SLEEPER), up.Child("b", SLEEPER))
    sup.start()
    try:
        sup.on_signal(signal.SIGTERM)
        assert sup.watch(poll=0.05) == 0
    finally:
        sup.stop()
    assert [c.proc.returncode for c in sup.children] == [-signal.SIGTERM, -signal.SIGTERM]
    assert "SIGTERM: stopping" in out.getvalue()


def test_a_child_ignoring_sigterm_is_stopped_harder():
    stubborn = _py(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.05)"
    )
    sup, out = _supervisor(up.Child("stubborn", stubborn), warm=0.5, cold=0.5)
    sup.start()
    time.sleep(0.5)  # let it install its handler
    started = time.monotonic()
    sup.stop()
    assert time.monotonic() - started < 5
    assert not sup.children[0].alive
    assert sup.children[0].proc.returncode in (-signal.SIGQUIT, -signal.SIGKILL)
    assert "cold shutdown" in out.getvalue()
