"""manage.py watch RUN_ID PATH: the history of one value from the command line."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agentrun.lifecycle import services
from agentrun.store import snapshots
from tests.base import make_people, play_incident

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident():
    return play_incident()


def watch(*args: str) -> str:
    out = StringIO()
    call_command("watch", *args, stdout=out)
    return out.getvalue()


def test_it_prints_the_one_change_of_the_cart_note(incident):
    out = watch(str(incident.pk), "memory.notes.cart")
    lines = out.splitlines()
    assert lines[0] == f"memory.notes.cart in run {incident.pk}"
    assert "step 2 post: added (set)" in lines
    assert "    before: (absent)" in lines
    assert any(
        line.startswith("    decided: Reading ben's cart. (calls get_cart)") for line in lines
    )
    assert lines[-1].startswith("1 change(s); now: ")
    assert "STOVE-1" in lines[-1]


def test_json_output_is_what_the_api_answers(incident):
    body = json.loads(watch(str(incident.pk), "/memory/notes/cart", "--json"))
    assert body["count"] == 1
    assert [(c["step"], c["kind"]) for c in body["changes"]] == [(2, "added")]


def test_a_fork_marks_the_inherited_change(incident):
    state = snapshots.load(incident.pk, 3, "pre")
    state["memory"]["notes"]["cart"] = "[]"
    fork = services.fork_run(
        incident, step=3, at="pre", state=state, user=make_people()["operator"]
    )
    out = watch(str(fork.pk), "memory.notes.cart")
    assert "step 2 post: added (set) [inherited from the parent]" in out
    assert "step 3 pre: set (edited before the step; " in out


def test_a_path_that_never_existed_says_so(incident):
    out = watch(str(incident.pk), "memory.notes.basket")
    assert "memory.notes.basket never existed in this run: no snapshot has it." in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["memory..notes"], "bad path: "),
        (["x" * 10_000], "10,000 characters long"),
        (["   "], "give the path"),
    ],
)
def test_bad_paths_are_command_errors(incident, args, says):
    with pytest.raises(CommandError, match=says):
        watch(str(incident.pk), *args)


def test_an_unknown_run_is_a_command_error():
    with pytest.raises(CommandError, match="no run"):
        watch("00000000-0000-4000-8000-000000000123", "memory")
    with pytest.raises(CommandError, match="not a valid run id"):
        watch("nope", "memory")


def test_a_limit_prints_the_first_changes_and_says_there_are_more(incident):
    lines = watch(str(incident.pk), "iteration", "--limit", "3").splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == [
        "step 1 post",
        "step 2 post",
        "step 3 post",
    ]
    assert lines[-2].startswith("... and more after these")
    assert lines[-1] == "more than 3 change(s); now: 10"
    body = json.loads(watch(str(incident.pk), "iteration", "--limit", "3", "--json"))
    assert (body["count"], body["more"], len(body["changes"])) == (None, True, 3)
    whole = json.loads(watch(str(incident.pk), "iteration", "--limit", "10", "--json"))
    assert (whole["count"], whole["more"], len(whole["changes"])) == (10, False, 10)
    with pytest.raises(CommandError, match="at least 1"):
        watch(str(incident.pk), "iteration", "--limit", "0")
