"""GET /api/runs/{id}/history: every step that changed one value, through the API."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentrun.lifecycle import services
from agentrun.store import snapshots
from tests.base import drive, play_incident

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident():
    return play_incident()


def history(client: Client, run, path: str, **params):
    return client.get(f"/api/runs/{run.pk}/history", {"path": path, **params})


def test_the_cart_note_changed_once_at_step_2_with_what_the_step_decided(viewer, incident):
    response = history(viewer, incident, "/memory/notes/cart")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["path"], body["pointer"]) == ("memory.notes.cart", "/memory/notes/cart")
    assert (body["ever_existed"], body["exists_now"], body["count"]) == (True, True, 1)
    (change,) = body["changes"]
    assert (change["step"], change["at"], change["kind"], change["inherited"]) == (
        2,
        "post",
        "added",
        False,
    )
    assert (change["before_exists"], change["before"]) == (False, None)
    assert [line["sku"] for line in json.loads(change["after"])] == ["STOVE-1", "TENT-2P"]
    assert change["decision"]["calls"] == [{"tool": "get_cart", "args": {"user": "ben"}}]
    assert change["decision"]["thought"] == "Reading ben's cart."
    assert [(c["tool"], c["status"]) for c in change["tool_calls"]] == [("get_cart", "ok")]
    assert change["diff_url"] == f"/runs/{incident.pk}/steps/2/diff/"
    assert body["start"]["exists"] is False


def test_dotted_and_pointer_paths_give_the_same_history(viewer, incident):
    a = history(viewer, incident, "memory.notes.cart").json()
    b = history(viewer, incident, "/memory/notes/cart").json()
    assert a == b


def test_a_fork_lists_its_parents_change_as_inherited(viewer, incident, people):
    state = snapshots.load(incident.pk, 3, "pre")
    state["memory"]["notes"]["cart"] = json.dumps([{"sku": "TENT-2P", "qty": 1}])
    fork = services.fork_run(incident, step=3, at="pre", state=state, user=people["operator"])

    body = history(viewer, fork, "memory.notes.cart").json()

    assert [(c["step"], c["at"], c["inherited"], c["run_id"]) for c in body["changes"]] == [
        (2, "post", True, str(incident.pk)),
        (3, "pre", False, str(fork.pk)),
    ]
    assert json.loads(body["changes"][1]["after"]) == [{"sku": "TENT-2P", "qty": 1}]


def test_a_path_that_never_existed_says_so(viewer, incident):
    body = history(viewer, incident, "memory.notes.basket").json()
    assert (body["ever_existed"], body["exists_now"], body["count"], body["changes"]) == (
        False,
        False,
        0,
        [],
    )


def test_changes_come_in_pages(viewer, incident):
    full = history(viewer, incident, "iteration").json()
    assert full["count"] == 10
    page = history(viewer, incident, "iteration", limit=3, offset=4).json()
    assert page["count"] == 10
    assert [c["step"] for c in page["changes"]] == [5, 6, 7]
    assert [(c["before"], c["after"]) for c in page["changes"]] == [(4, 5), (5, 6), (6, 7)]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("memory..notes", "expected a key"),
        ("memory.notes[cart]", "bracket"),
        ("/a~2", "escape"),
        ("x" * 10_000, "1000"),
        ("", "path"),
    ],
)
def test_a_bad_path_is_a_400_that_says_why(viewer, incident, path, says):
    response = history(viewer, incident, path)
    assert response.status_code == 400, response.content
    body = response.json()
    assert says in json.dumps(body), body
    assert "path" in json.dumps(body)


def test_an_unknown_run_is_a_404(viewer):
    response = viewer.get(
        "/api/runs/00000000-0000-4000-8000-000000000123/history", {"path": "memory"}
    )
    assert response.status_code == 404


def test_without_a_token_it_is_a_401(incident):
    assert history(Client(), incident, "memory").status_code == 401


def test_a_value_too_big_is_left_out_and_marked(viewer, people):
    big = "x" * 70_000
    run = drive(
        services.start_run(
            "scripted",
            {
                "goal": "g",
                "steps": [
                    {"thought": "t", "calls": [{"tool": "echo", "args": {"b": big}}]},
                    {"final": "ok"},
                ],
            },
        )
    )
    body = history(viewer, run, "tool_calls[0].result").json()
    (change,) = body["changes"]
    assert (change["after_exists"], change["after"], change["after_truncated"]) == (
        True,
        None,
        True,
    )


def test_a_long_history_is_read_only_as_far_as_the_page_and_says_there_is_more(
    viewer, incident, monkeypatch
):
    from agentrun.store import watch

    monkeypatch.setattr(watch, "COUNTED", 3)  # "long": more than 3 changes
    first = history(viewer, incident, "iteration", limit=2).json()
    assert (first["count"], first["more"], first["next_offset"]) == (None, True, 2)
    assert [c["step"] for c in first["changes"]] == [1, 2]
    assert first["exists_now"] and first["ever_existed"]
    middle = history(viewer, incident, "iteration", limit=3, offset=4).json()
    assert (middle["count"], middle["more"], middle["next_offset"]) == (None, True, 7)
    assert [c["step"] for c in middle["changes"]] == [5, 6, 7]
    last = history(viewer, incident, "iteration", limit=3, offset=8).json()
    assert (last["count"], last["more"], last["next_offset"]) == (10, False, None)
    assert [c["step"] for c in last["changes"]] == [9, 10]
    assert first["snapshots_read"] < last["snapshots_read"]


def test_a_short_history_is_counted_whole_on_every_page(viewer, incident):
    page = history(viewer, incident, "iteration", limit=3, offset=0).json()
    assert (page["count"], page["more"], page["next_offset"]) == (10, True, 3)
