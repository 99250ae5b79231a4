"""Production security comes from the environment: `check --deploy` passes with the documented
setup (docs/operations/deployment.md, "Running in production").

Settings are read once per process, so each case runs `manage.py` in a child process with
exactly the environment it names (nothing inherited from the test run's own settings).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys

from django.conf import settings

SECURITY_SETTINGS = (
    "SECURE_SSL_REDIRECT",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_PROXY_SSL_HEADER",
)


def documented_production_environment() -> dict[str, str]:
    """The variables exported by the "Running in production" block of the deployment page."""
    page = (settings.BASE_DIR / "docs" / "operations" / "deployment.md").read_text()
    section = page.split("## Running in production", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    env: dict[str, str] = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])
    # The page leaves the key to the reader ("…"); a real one is long and random.
    assert env["SECRET_KEY"] == "…"
    env["SECRET_KEY"] = secrets.token_urlsafe(64)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], **env, "AGENTRUN_VAR_DIR": str(settings.VAR_DIR)}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def security_settings(env: dict[str, str]) -> dict[str, object]:
    code = (
        "import json\n"
        "from django.conf import settings\n"
        f"print(json.dumps({{n: getattr(settings, n) for n in {SECURITY_SETTINGS!r}}}))"
    )
    result = manage(env, "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])  # after the shell's own notice


def test_the_documented_production_environment_passes_check_deploy():
    env = documented_production_environment()

    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_without_https_check_deploy_warns_about_cookies_hsts_and_redirect():
    env = documented_production_environment()
    del env["AGENTRUN_HTTPS"]

    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode == 1
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"(security.{warning})" in result.stderr


def test_the_embedded_mode_keeps_plain_http_working():
    values = security_settings({})

    assert values == {
        "SECURE_SSL_REDIRECT": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_HSTS_PRELOAD": False,
        "SECURE_PROXY_SSL_HEADER": None,
    }


def test_https_trusts_the_proxys_header_and_each_setting_can_be_overridden():
    https = security_settings({"AGENTRUN_HTTPS": "1"})
    assert https["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert https["SECURE_HSTS_SECONDS"] == 31536000
    assert https["SESSION_COOKIE_SECURE"] is https["SECURE_HSTS_PRELOAD"] is True

    overridden = security_settings(
        {
            "AGENTRUN_HTTPS": "1",
            "SECURE_HSTS_SECONDS": "3600",
            "SECURE_HSTS_PRELOAD": "0",
            "AGENTRUN_PROXY_SSL_HEADER": "",
        }
    )
    assert overridden["SECURE_HSTS_SECONDS"] == 3600
    assert overridden["SECURE_HSTS_PRELOAD"] is False
    assert overridden["SECURE_PROXY_SSL_HEADER"] is None
    assert overridden["SECURE_SSL_REDIRECT"] is overridden["CSRF_COOKIE_SECURE"] is True


def test_check_deploy_fails_without_a_secret_key_of_its_own():
    env = documented_production_environment()
    del env["SECRET_KEY"]

    result = manage(env, "check", "--deploy")

    assert result.returncode == 1
    assert "(agentrun.E001) SECRET_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_deploy_fails_with_the_embedded_default_key_set_by_hand():
    env = documented_production_environment()
    env["SECRET_KEY"] = "embedded-insecure-key-set-SECRET_KEY-in-production"

    result = manage(env, "check", "--deploy")

    assert result.returncode == 1
    assert "agentrun.E001" in result.stderr


def test_plain_check_keeps_the_embedded_mode_working_without_a_key():
    result = manage({}, "check")

    assert result.returncode == 0, result.stderr
