"""One JSON policy at every entry a person uses: what nests too deep is refused with a
message naming the limit, and nothing is written.

The runs that *are* accepted, up to the limit, are executed by a real worker in
test_hostile_json_worker.py.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agentrun.agents import InvalidInput
from agentrun.lifecycle import services
from agentrun.models import Event, Run
from agentrun.security.storable import STATE_ROOM, escape_text, shape_problem, unescape_text
from tests.agentrun.jsonshapes import depth_of, limit, nest, scripted_input
from tests.base import make_people

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def operator(people):
    client = Client()
    client.force_login(people["operator"])
    return client


def counts():
    return Run.objects.count(), Event.objects.count()


def post_run(client, input):
    return client.post(
        "/api/runs", json.dumps({"agent": "scripted", "input": input}), "application/json"
    )


def test_the_api_takes_input_up_to_the_limit_and_refuses_one_level_more(operator):
    accepted = post_run(operator, scripted_input(limit()))
    assert accepted.status_code == 201, accepted.content

    before = counts()
    refused = post_run(operator, scripted_input(limit() + 1))
    assert refused.status_code == 400
    assert f"nests deeper than {limit()} levels" in refused.json()["detail"]
    assert "AGENTRUN_JSON_MAX_DEPTH" in refused.json()["detail"]
    assert counts() == before


@pytest.mark.parametrize("depth", [500, 940, 5000])
def test_the_api_refuses_arguments_nested_hundreds_of_levels_deep(operator, depth):
    # Finding 1: 500-940 levels were accepted (201) and then crashed every attempt.
    # The body is written as text: Python's own encoder stops near 1,000 levels.
    args = '{"a":' * depth + "1" + "}" * depth
    body = (
        '{"agent": "scripted", "input": {"goal": "g", "steps": [{"thought": "t", '
        f'"calls": [{{"tool": "echo", "args": {args}}}]}}, {{"final": "done"}}]}}}}'
    )
    before = counts()
    response = operator.generic("POST", "/api/runs", body, content_type="application/json")
    assert response.status_code == 400, response.content[:300]
    assert "nest" in response.json()["detail"]
    assert counts() == before


def test_start_run_refuses_the_same_as_the_api():
    # The one check every entry shares: the commands and the pages call services.
    before = counts()
    with pytest.raises(InvalidInput, match=f"nests deeper than {limit()} levels"):
        services.start_run("scripted", scripted_input(limit() + 1))
    assert counts() == before


def test_startrun_refuses_too_deep_input_and_creates_nothing(tmp_path):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(scripted_input(limit() + 1)))
    before = counts()
    with pytest.raises(CommandError, match=f"nests deeper than {limit()} levels"):
        call_command("startrun", "scripted", "--input", f"@{path}")
    assert counts() == before


def _walkthrough(people):
    from tests.debugger import runs

    return runs.walkthrough_run(people["operator"])


def _state_nesting(parent, depth: int) -> dict:
    """The parent's pre state of step 3, its first tool call's args nested to `depth` overall."""
    from agentrun.store import snapshots

    state = snapshots.load(parent.pk, 3, "pre")
    state["tool_calls"][0]["args"] = nest(depth - 3)  # under the state, its list, its record
    assert depth_of(state) == depth
    return state


def test_a_fork_takes_a_state_as_deep_as_a_state_may_be_and_refuses_more(operator, people):
    parent = _walkthrough(people)
    url = f"/runs/{parent.pk}/steps/3/pre/fork/"
    deepest = limit() + STATE_ROOM
    before = counts()
    refused = operator.post(
        url,
        {"mode": "sandbox", "reason": "", "state": json.dumps(_state_nesting(parent, deepest + 1))},
    )
    assert refused.status_code == 400
    assert f"nests deeper than {deepest} levels" in refused.content.decode()
    assert counts() == before

    api = operator.post(
        f"/api/runs/{parent.pk}/fork",
        json.dumps({"step": 3, "at": "pre", "state": _state_nesting(parent, deepest + 1)}),
        "application/json",
    )
    assert api.status_code == 400 and "nests deeper" in api.json()["detail"]
    assert counts() == before

    accepted = operator.post(
        url, {"mode": "sandbox", "reason": "", "state": json.dumps(_state_nesting(parent, deepest))}
    )
    assert accepted.status_code == 302, accepted.content[:500]
    assert Run.objects.count() == before[0] + 1


def test_the_fork_command_refuses_a_too_deep_state(tmp_path, people):
    parent = _walkthrough(people)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(_state_nesting(parent, limit() + STATE_ROOM + 1)))
    before = counts()
    with pytest.raises(CommandError, match="nests deeper"):
        call_command(
            "fork", str(parent.pk), "3", "--at", "pre", "--mode", "sandbox", "--state", f"@{path}"
        )
    assert counts() == before


def test_the_check_is_iterative_and_names_where_it_stopped():
    problem = shape_problem({"x": [nest(100_000)]})
    assert problem is not None and problem.startswith("$.x[0].a.a")
    assert "nests deeper than" in problem


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "nul \x00 inside",
        "lone \ud800 surrogate",
        "escape ␛u0000 already",
        "␛",
        "\udfff\x00",
    ],
)
def test_escaping_is_lossless_and_leaves_storable_text_alone(text):
    escaped = escape_text(text)
    assert unescape_text(escaped) == text
    assert "\x00" not in escaped
    escaped.encode()  # valid UTF-8
    if text == "plain":
        assert escaped is text
