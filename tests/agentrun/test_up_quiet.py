"""The first minute of `make up` says each thing once: no line repeats while nothing
happens (the reconciler's idle passes are DEBUG), and kombu has no warning to give."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from tests.up_process import Up, clean_env

pytestmark = pytest.mark.worker

MINUTE = 60.0
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
NUMBER = re.compile(r"\d+(\.\d+)?")


def same_line(line: str) -> str:
    """A line with what changes from one report to the next (time, ids, counts) masked."""
    line = TIMESTAMP.sub("", line.rstrip())
    return NUMBER.sub("#", UUID.sub("<id>", line))


def repeated(text: str) -> dict[str, int]:
    # Lines without a letter are blank or ASCII art (Celery's banner): not messages.
    counts = Counter(same_line(line) for line in text.splitlines() if re.search("[A-Za-z]", line))
    return {line: n for line, n in counts.items() if n > 1}


def test_repeated_lines_are_found_whatever_their_timestamps_and_ids():
    text = (
        "2026-11-26 11:47:03,556 INFO celery.beat Scheduler: Sending due task reconcile\n"
        "2026-11-26 11:47:08,554 INFO celery.beat Scheduler: Sending due task reconcile\n"
        "Task x[2747c29c-3028-4383-ad45-da5bb072fbeb] succeeded in 0.013s\n"
        "Task x[61a7a098-d874-4b58-b5f9-a469295d9041] succeeded in 0.02s\n"
        "- ** ----------\n- ** ----------\n\n\nonce\n"
    )
    assert repeated(text) == {
        "INFO celery.beat Scheduler: Sending due task reconcile": 2,
        "Task x[<id>] succeeded in #s": 2,
    }


def test_the_first_minute_of_up_repeats_no_line_and_has_no_kombu_warning(tmp_path):
    # `make up` as a user runs it: embedded (SQLite and the filesystem broker), its own var
    # dir, the reconciler every 5 s (the default), an agent module of one's own loaded.
    env = clean_env(
        AGENTRUN_VAR_DIR=str(tmp_path / "var"),
        AGENTRUN_AGENT_MODULES="agentrun.examples.glossary",
    )
    up = Up(tmp_path / "up.log", env)
    try:
        up.wait_for("agentrun is up: ", timeout=300)
        up.wait_for("celery.apps.worker", timeout=120)  # the worker (and its beat) started
        time.sleep(max(MINUTE - (time.monotonic() - up.started), 0))
        minute = up.text()
    finally:
        up.stop()

    assert "celery.beat beat: Starting" in minute  # the reconciler was scheduled all along
    assert "No hostname was supplied" not in minute
    assert "WARNING kombu" not in minute
    assert repeated(minute) == {}
    # What it prints instead, once: the agents and tools it registered, yours included.
    assert "agents:   llm, scripted, shop (built-in); glossary (agentrun.examples.glossary)" in (
        minute
    )
    assert "define, file_note (agentrun.examples.glossary)" in minute
