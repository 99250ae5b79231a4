"""The Makefile's installs: `make up` needs the runtime dependencies only, `make test` adds
[dev] on top, and a changed pyproject.toml redoes both. Checked with `make -n` (nothing is
installed) on a throwaway virtualenv folder whose stamps the test sets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PIP = "pip install --disable-pip-version-check -r {venv}/requirements.txt"
DEV_PIP = "pip install --disable-pip-version-check -r {venv}/requirements-dev.txt"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def plan(target: str, venv: Path) -> str:
    """What `make TARGET` would run, without running it."""
    out = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def venv(tmp_path) -> Path:
    """A folder make takes for a virtualenv: bin/python exists, newer than pyproject.toml."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    return tmp_path


def touch(path: Path, after: Path) -> None:
    path.touch()
    later = after.stat().st_mtime + 10
    os.utime(path, (later, later))


def test_a_fresh_make_up_installs_the_runtime_dependencies_only(venv):
    up = plan("up", venv)
    assert RUNTIME_PIP.format(venv=venv) in up
    assert "requirements-dev.txt" not in up
    assert "manage.py up" in up


def test_make_test_after_make_up_installs_the_dev_dependencies_only(venv):
    touch(venv / ".installed", ROOT / "pyproject.toml")  # what make up left

    assert "pip install" not in plan("up", venv)
    test = plan("test", venv)
    assert DEV_PIP.format(venv=venv) in test
    assert RUNTIME_PIP.format(venv=venv) not in test
    assert "-m pytest" in test


def test_nothing_is_installed_again_until_pyproject_changes(venv):
    touch(venv / ".installed", ROOT / "pyproject.toml")
    touch(venv / ".installed-dev", venv / ".installed")
    assert "pip install" not in plan("test", venv)

    # pyproject.toml newer than both stamps: the runtime install, then the dev one.
    older = (ROOT / "pyproject.toml").stat().st_mtime - 10
    for stamp in (".installed", ".installed-dev"):
        os.utime(venv / stamp, (older, older))
    test = plan("test", venv)
    assert test.index(RUNTIME_PIP.format(venv=venv)) < test.index(DEV_PIP.format(venv=venv))


def test_the_requirement_lists_are_pyprojects_pins(venv):
    # Run the two list commands make would run, with this Python.
    for line in plan("test", venv).splitlines():
        if "tomllib" in line and "> " in line:
            subprocess.run(line, shell=True, cwd=ROOT, check=True)  # noqa: S602 - make's line
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = (venv / "requirements.txt").read_text().split()
    dev = (venv / "requirements-dev.txt").read_text().split()
    assert runtime == project["dependencies"]
    assert dev == project["dependencies"] + project["optional-dependencies"]["dev"]
