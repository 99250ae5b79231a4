"""README, "Your own agent": its example is the shipped module, and its steps work as written:
`make up` with the module named, then `startrun` in a second terminal, on a real worker."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from django.conf import settings

from agentrun.celery import app as celery_app
from agentrun.models import Run, ToolCall
from tests.up_process import ROOT, Up, clean_env
from tests.workers import database_url

EXAMPLE = ROOT / "agentrun" / "examples" / "glossary.py"


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Your own agent\n")
    return text[start : text.index("\n## ", start + 1)]


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", section(), re.M | re.S)


def shell_steps(block: str) -> tuple[dict[str, str], list[str]]:
    """The `export NAME=value` lines of a block as an environment, and its commands."""
    env, commands = {}, []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "export":
            name, value = words[1].split("=", 1)
            env[name] = value
        elif words:
            commands.append(line)
    return env, commands


def test_the_readme_shows_the_example_module_verbatim():
    (shown,) = code_blocks("python")
    assert shown == EXAMPLE.read_text()


def test_the_make_up_of_the_readme_is_the_up_command():
    # The steps test runs `manage.py up` for `make up`: that is what the Makefile runs.
    recipe = (ROOT / "Makefile").read_text().split("\nup:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/python manage.py up " in recipe


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_readme_steps_run_the_example_agent_on_a_real_worker(tmp_path):
    first, second = code_blocks("sh")[:2]
    up_env, up_commands = shell_steps(first)
    run_env, run_commands = shell_steps(second)
    assert up_commands == ["make up"]
    assert up_env == run_env == {"AGENTRUN_AGENT_MODULES": "agentrun.examples.glossary"}
    (startrun,) = run_commands
    argv = shlex.split(startrun)
    assert argv[0] == ".venv/bin/python"
    argv[0] = sys.executable

    # A user's shell, pointed at this test's database and broker, with its own var dir.
    var = tmp_path / "var"
    base = clean_env(
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        AGENTRUN_VAR_DIR=str(var),
    )
    celery_app.control.purge()  # nothing left over from earlier tests on a shared broker
    up = Up(tmp_path / "up.log", {**base, **up_env})
    try:
        up.wait_for("agentrun is up: ", timeout=300)
        banner = up.text()
        assert "glossary (agentrun.examples.glossary)" in banner
        assert "define, file_note (agentrun.examples.glossary)" in banner

        done = subprocess.run(
            argv, cwd=ROOT, env={**base, **run_env}, capture_output=True, text=True, timeout=180
        )
    finally:
        up.stop()

    assert done.returncode == 0, done.stdout + done.stderr + up.text()[-4000:]
    run_id, status = done.stdout.split()[:2]
    assert status == "succeeded"
    run = Run.objects.get(pk=run_id)
    assert (run.agent, run.status) == ("glossary", "succeeded")
    assert run.final_answer == "lease means how long a worker owns a step (noted)."
    calls = ToolCall.objects.filter(run=run).order_by("step__number")
    assert [(c.tool, c.kind, c.status) for c in calls] == [
        ("define", "read", "ok"),
        ("file_note", "write", "ok"),
    ]
    # The write tool's side effect happened once: one note, under the call's key.
    write = calls[1]
    assert len(write.attempts) == 1
    notes = list((var / "notes").iterdir())
    assert [n.name for n in notes] == [write.idempotency_key.replace(":", "_") + ".txt"]
    assert notes[0].read_text() == "lease: how long a worker owns a step"
    assert write.result == {"path": str(notes[0]), "duplicate": False}


# --- what the section says of the agent and its state, held to the code ------------------


@pytest.fixture
def example(settings, tmp_path):
    """The example module, imported (so registered) for this test only; notes under tmp_path."""
    import importlib

    from agentrun.agents import AGENTS
    from agentrun.tools import REGISTRY

    settings.VAR_DIR = tmp_path
    module = importlib.import_module("agentrun.examples.glossary")
    yield module
    AGENTS.pop("glossary", None)
    AGENTS.pop("glossary-careless", None)
    for name in ("define", "file_note"):
        REGISTRY.pop(name, None)
    sys.modules.pop("agentrun.examples.glossary", None)


@pytest.mark.django_db
def test_a_bad_input_is_refused_with_the_agents_message(example):
    from agentrun.agents import InvalidInput
    from agentrun.lifecycle import services

    with pytest.raises(InvalidInput, match="word must be a non-empty string"):
        services.start_run("glossary", {"word": " "})
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_note_that_is_not_a_string_fails_the_step_with_its_path(example):
    from agentrun.agents import register
    from agentrun.lifecycle import services
    from tests.base import drive

    @register
    class Careless(example.Glossary):
        name = "glossary-careless"

        def observe(self, st, decision, results, ctx):
            for r in results:
                st.memory["notes"]["meaning"] = r.result["meaning"]  # null for an unknown word

    run = drive(services.start_run("glossary-careless", {"word": "zebra"}))

    assert run.status == "failed"
    assert run.error.endswith(
        "step 1's update left a state the agent's schema refuses: "
        "memory.notes.meaning must be a string, got null"
    ), run.error


@pytest.mark.django_db
def test_a_sandbox_fork_of_the_example_files_no_second_note(example, tmp_path):
    from agentrun.lifecycle import services
    from tests.base import drive

    parent = drive(services.start_run("glossary", {"word": "fork"}))
    assert parent.status == "succeeded", parent.error
    (note,) = (tmp_path / "notes").iterdir()

    fork = drive(services.fork_run(parent, step=2, at="pre", mode="sandbox"))

    assert fork.status == "succeeded", fork.error
    assert fork.final_answer == "fork means a run replayed from a snapshot (noted)."
    assert ToolCall.objects.get(run=fork, tool="file_note").status == "skipped"
    assert list((tmp_path / "notes").iterdir()) == [note]
