"""The fork page's live check: the edited state checked as a fork would check it, and its diff."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from django.test import Client

from agentrun.lifecycle import services
from agentrun.models import Event, Run, Snapshot
from agentrun.store import snapshots
from tests.base import PASSWORD
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def parent(people):
    return runs.walkthrough_run(people["operator"])


def check_url(run: Run, step: int = 3, at: str = "pre") -> str:
    return f"/runs/{run.pk}/steps/{step}/{at}/fork/check/"


def state_of(run: Run, step: int = 3, at: str = "pre") -> dict:
    return snapshots.load(run.pk, step, at)


def check(client: Client, run: Run, state, step: int = 3, at: str = "pre"):
    text = state if isinstance(state, str) else json.dumps(state, indent=2)
    return client.post(check_url(run, step, at), {"state": text}, **hx("fork-state"))


def counts() -> tuple[int, int, int]:
    return Run.objects.count(), Event.objects.count(), Snapshot.objects.count()


def text_of(response) -> str:
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="fork-check"')  # the fragment, not a page
    return htmllib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def valid(response) -> str:
    return re.search(r'data-valid="(\w+)"', response.content.decode()).group(1)


def test_a_valid_edit_is_checked_and_previewed_as_the_diff_the_fork_starts_from(client_for, parent):
    state = state_of(parent)
    state["memory"]["goal"] = "Refund order 1042, no stock"
    before = counts()
    response = check(client_for("operator"), parent, state)
    assert response.status_code == 200 and valid(response) == "true"
    text = text_of(response)
    assert "Valid: a fork can start from this state" in text
    assert "1 changed in memory" in text and "memory.goal" in text
    assert "the snapshot → your edited state" in text
    assert "Refund order 1042, no stock" in text
    assert counts() == before  # a check forks nothing


def test_the_snapshots_own_state_is_valid_and_has_no_changes(client_for, parent):
    response = check(client_for("admin"), parent, state_of(parent))
    assert valid(response) == "true"
    assert "None: the fork replays the snapshot's state as it is" in text_of(response)
    # Reformatted is still unchanged.
    response = check(client_for("admin"), parent, json.dumps(state_of(parent)))
    assert "None: the fork replays" in text_of(response)


def test_a_schema_error_is_named_and_the_diff_still_shows(client_for, parent):
    state = state_of(parent)
    state["memory"]["notes"] = ["a", "b"]
    before = counts()
    response = check(client_for("operator"), parent, state)
    assert response.status_code == 200 and valid(response) == "false"
    text = text_of(response)
    assert "A fork would refuse this state: memory.notes must be an object" in text
    assert "Valid:" not in text
    assert "memory.notes" in text.split("Your changes", 1)[1]
    assert 'data-error-path="memory.notes"' in response.content.decode()  # for the tree
    assert counts() == before


def test_the_check_refuses_what_the_fork_refuses(client_for, parent):
    """The same verdict as forking with that state, for each kind of schema problem."""
    olga = client_for("operator")
    cases = []
    for edit in (
        lambda s: s.update(phase="bogus"),
        lambda s: s.update(iteration=-1),
        lambda s: s.update(surprise=1),
        lambda s: s["memory"].update(notes="text"),
    ):
        state = state_of(parent)
        edit(state)
        cases.append(state)
    for state in cases:
        response = check(olga, parent, state)
        assert valid(response) == "false"
        with pytest.raises(services.ForkError) as refused:
            services.fork_run(parent, step=3, state=state)
        assert str(refused.value).removeprefix("state: ") in text_of(response)


def test_text_that_is_not_json_says_where(client_for, parent):
    text = '{\n  "phase": "planning"\n  "memory": {}\n}'
    response = check(client_for("operator"), parent, text)
    assert response.status_code == 200 and valid(response) == "false"
    page = text_of(response)
    assert "Invalid JSON at line 3, column 3: Expecting ',' delimiter." in page
    assert "Your changes" not in page  # nothing to compare
    for bad in ('{"iteration": NaN}', "", "[1, 2", '"just text"'):
        response = check(client_for("operator"), parent, bad)
        assert response.status_code == 200 and valid(response) == "false", bad


@pytest.mark.parametrize(
    ("number", "message"),
    [
        ("1e999", "Invalid JSON: number out of range: 1e999."),
        ("-1e999", "Invalid JSON: number out of range: -1e999."),
        ("9" * 4000, "Invalid JSON: integer too long (4000 digits)."),
    ],
)
def test_numbers_the_policy_refuses_are_named_not_a_crash(client_for, parent, number, message):
    state = json.dumps(state_of(parent), indent=2)
    text = state.replace('"iteration": 2', f'"iteration": {number}', 1)
    assert text != state
    response = check(client_for("operator"), parent, text)
    assert response.status_code == 200 and valid(response) == "false"
    assert message in text_of(response)


def test_a_missing_state_field_is_an_error_not_a_crash(client_for, parent):
    response = client_for("operator").post(check_url(parent), {}, **hx("fork-state"))
    assert response.status_code == 200
    assert "The state can't be empty" in text_of(response)


def test_a_state_nested_too_deeply_is_refused(client_for, parent, settings):
    state = state_of(parent)
    deep: dict = {}
    state["memory"]["notes"]["deep"] = deep
    for _ in range(settings.AGENTRUN_JSON_MAX_DEPTH + 30):
        deep["x"] = {}
        deep = deep["x"]
    response = check(client_for("operator"), parent, state)
    assert valid(response) == "false"
    assert "nests deeper than" in text_of(response)
    # Deeper than Python's parser goes: still a message.
    response = check(client_for("operator"), parent, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 200 and valid(response) == "false"
    assert "nested too deeply" in text_of(response) or "nests deeper than" in text_of(response)


def test_a_state_too_large_to_fork_is_refused(client_for, parent, settings):
    settings.AGENTRUN_MAX_INPUT_BYTES = 1000  # a fork's state may be 8x that
    state = state_of(parent)
    state["memory"]["notes"]["big"] = "x" * 9000
    response = check(client_for("operator"), parent, state)
    assert valid(response) == "false"
    assert "too large" in text_of(response)


def test_a_body_over_the_upload_limit_is_a_400_not_a_500(client_for, parent, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    state = state_of(parent)
    state["memory"]["notes"]["big"] = "x" * 20_000
    response = check(client_for("operator"), parent, state)
    assert response.status_code == 400


def test_text_the_database_cant_store_is_refused(client_for, parent):
    state = state_of(parent)
    state["memory"]["goal"] = "nul \x00 here"
    response = check(client_for("operator"), parent, state)
    assert valid(response) == "false"
    assert "NUL character" in text_of(response)


def test_a_done_state_would_run_nothing(client_for, parent):
    last = parent.steps.order_by("-number").first().number
    response = check(client_for("operator"), parent, state_of(parent, last, "post"), last, "post")
    assert valid(response) == "false"
    assert "nothing would run" in text_of(response)
    assert 'data-error-path="phase"' in response.content.decode()


def test_only_operators_may_check_a_fork(client_for, parent):
    state = state_of(parent)
    assert check(client_for("viewer"), parent, state).status_code == 403
    assert check(client_for("outsider"), parent, state).status_code == 403
    anonymous = check(client_for(None), parent, state)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert check(client_for("admin"), parent, state).status_code == 200


def test_it_takes_a_post_with_a_csrf_token(people, client_for, parent):
    assert client_for("operator").get(check_url(parent)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    assert strict.login(username=people["operator"].username, password=PASSWORD)
    text = json.dumps(state_of(parent))
    assert strict.post(check_url(parent), {"state": text}).status_code == 403
    page = strict.get(f"/runs/{parent.pk}/steps/3/pre/fork/")
    token = page.cookies["csrftoken"].value
    response = strict.post(check_url(parent), {"state": text}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200


def test_an_unknown_snapshot_or_run_is_a_404(client_for, parent):
    olga = client_for("operator")
    assert check(olga, parent, state_of(parent), step=99).status_code == 404
    other = "/runs/00000000-0000-0000-0000-000000000000/steps/3/pre/fork/check/"
    assert olga.post(other, {"state": "{}"}).status_code == 404


def test_the_fork_page_wires_the_editor_to_the_check(client_for, parent):
    html = client_for("operator").get(f"/runs/{parent.pk}/steps/3/pre/fork/").content.decode()
    area = re.search(r'<textarea id="fork-state"[^>]*>', html).group(0)
    assert f'hx-post="{check_url(parent)}"' in area
    assert 'hx-target="#fork-check"' in area and "delay:" in area
    assert 'id="fork-tree"' in html and "forkeditor.js" in html
    assert '<div id="fork-check"' in html
    # Without JavaScript the textarea is the editor: the tree and its switch stay hidden.
    assert " hidden" not in area
    assert re.search(r'<div class="state-tree" id="fork-tree"[^>]* hidden', html)
    assert re.search(r'<span class="editor-views" data-editor-views hidden>', html)
