"""GET /api/runs/{id}/search: the run page's search within a run, through the API."""

from __future__ import annotations

import pytest
from django.test import Client

from agentrun.store import callsearch, search
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people):
    search.forget_call_texts()
    made = long_run(people["operator"], 40, retried=(7, 21), backoff={30: 2.0})
    yield made
    search.forget_call_texts()


def found(client: Client, run, **params):
    response = client.get(f"/api/runs/{run.pk}/search", params)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["run_id"] == str(run.pk) and body["count"] == len(body["steps"])
    return body["steps"]


def test_text_in_results_arguments_and_thoughts_is_found_in_any_case(viewer, run):
    assert found(viewer, run, q="VALUE-33") == [33]  # a result
    assert found(viewer, run, q="item-4") == [4]  # arguments (step 40 answers, no call)
    assert found(viewer, run, q="reason 12") == [12]  # a rationale
    assert found(viewer, run, q="thought number 3") == [3, *range(30, 40)]
    assert found(viewer, run, q="nowhere at all") == []


def test_the_other_criteria_alone_and_together(viewer, run):
    assert found(viewer, run, tool="ledger_write") == [10, 20, 30]
    assert found(viewer, run, tool="ledger_write", q="value-2") == [20]
    assert found(viewer, run, kind="write", call="ok") == [10, 20, 30]
    assert found(viewer, run, retried="true") == [7, 21, 30]
    assert found(viewer, run, waits="true") == [30]
    assert found(viewer, run, status="succeeded", phase="done") == [40]


def test_no_criterion_is_every_step_and_a_tool_never_called_none(viewer, run):
    assert found(viewer, run) == list(range(1, 41)) == found(viewer, run, q="  ")
    assert found(viewer, run, tool="no_such_tool") == []


def test_a_long_runs_stored_index_gives_the_same_answer(viewer, run, settings):
    before = found(viewer, run, q="value-1")
    settings.AGENTRUN_SEARCH_INDEX_STEPS = 10
    search.forget_call_texts()
    assert callsearch.build(run.pk) > 0

    assert found(viewer, run, q="value-1") == before == [1, *range(10, 20)]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"kind": "sideways"}, "kind"),
        ({"status": "sleeping"}, "status"),
        ({"q": "x" * 201}, "q"),
        ({"q": "a\x00b"}, "q"),
        ({"retried": "perhaps"}, "retried"),
    ],
)
def test_a_bad_filter_is_a_clear_400(viewer, run, params, field):
    response = viewer.get(f"/api/runs/{run.pk}/search", params)

    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"]
    if field is not None:
        assert body.get("field", field) == field and field in str(body)


def test_an_unknown_run_is_a_404_and_no_token_a_401(viewer, run):
    assert (
        viewer.get("/api/runs/00000000-0000-0000-0000-000000000000/search?q=x").status_code == 404
    )
    assert Client().get(f"/api/runs/{run.pk}/search?q=x").status_code == 401


@pytest.mark.parametrize("param", ["q", "tool", "kind", "call", "status", "phase"])
def test_an_empty_criterion_is_no_criterion_and_none_matches_every_step(viewer, run, param):
    everything = found(viewer, run)
    assert everything == list(range(1, 41))
    assert found(viewer, run, **{param: ""}) == everything
