"""Search within a run: one filter over its steps, in the run page's query string."""

from __future__ import annotations

import re

import pytest

from agentrun.models import Event, Step, ToolCall
from agentrun.store.search import matching_steps
from tests.debugger import runs
from tests.debugger.conftest import hx
from tests.debugger.long_runs import long_run

pytestmark = pytest.mark.django_db


def rows_in(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-n="(\d+)" class="row', html)]


@pytest.fixture
def run(people):
    return long_run(
        people["operator"],
        400,
        failed=None,
        retried=(50, 150),
        backoff={220: 2.0},
        thought=lambda k: "Check the refund ledger" if k == 77 else f"Thought number {k}",
    )


def test_each_criterion_filters_the_steps(run):
    assert matching_steps(run, tool="ledger_write") == set(range(10, 400, 10))
    assert matching_steps(run, kind="write") == set(range(10, 400, 10))
    assert matching_steps(run, retried=True) == {50, 150, 220}
    assert matching_steps(run, waits=True) == {220}
    assert matching_steps(run, phase="done") == {400}
    assert matching_steps(run, status="succeeded") == set(range(1, 401))
    assert matching_steps(run, status="failed") == set()
    ToolCall.objects.filter(run=run, step__number=30, tool="lookup").update(status="failed")
    assert matching_steps(run, call="failed") == {30}
    # The three call criteria hold for one call together.
    assert matching_steps(run, tool="lookup", call="failed") == {30}
    assert matching_steps(run, tool="ledger_write", call="failed") == set()
    # Criteria combine.
    assert matching_steps(run, tool="ledger_write", retried=True) == {50, 150, 220}
    assert matching_steps(run, tool="lookup", waits=True, phase="executing") == {220}
    assert matching_steps(run, tool="lookup", waits=True, phase="reflecting") == set()


def test_text_is_found_in_thoughts_rationales_arguments_and_results(run):
    assert matching_steps(run, q="REFUND ledger") == {77}  # thought, any case
    assert matching_steps(run, q="reason 123") == {123}  # rationale
    assert matching_steps(run, q="item-321") == {321}  # arguments
    assert matching_steps(run, q="value-333") == {333}  # a result, stored compressed
    assert matching_steps(run, q='"amount": 40') | matching_steps(run, q="amount") >= {40}
    assert matching_steps(run, q="value-333", tool="ledger_write") == set()
    assert matching_steps(run, q="nowhere to be found") == set()


def test_a_step_waiting_for_approval_counts_as_waited(people):
    run = runs.waiting_run(people["operator"])
    assert matching_steps(run, waits=True) == {2}
    assert Event.objects.filter(run=run, kind="approval_requested").exists()


def test_the_page_lists_only_the_matching_steps_and_dims_the_rest_of_the_strip(client_for, run):
    response = client_for("viewer").get(f"/runs/{run.pk}/?tool=ledger_write&retried=1")
    html = response.content.decode()
    assert rows_in(html) == [50, 150, 220]
    assert response.context["selected"] == 50
    assert "3 matching" in html
    cells = re.findall(r'data-lo="(\d+)" data-hi="(\d+)" class="cell bin ([^"]+)"', html)
    lit = [(int(lo), int(hi)) for lo, hi, cls in cells if "dim" not in cls]
    assert len(lit) == 3 and all(any(lo <= n <= hi for lo, hi in lit) for n in (50, 150, 220))
    # The form shows the filter, and the list's "load more" links keep it.
    assert 'value="ledger_write" selected' in html
    assert 'data-window="/runs/' in html and "tool=ledger_write" in html


def test_htmx_search_swaps_the_strip_and_the_list_and_polls_with_the_filter(client_for, run):
    Step.objects.filter(run=run).update()  # nothing changes: the run is finished
    body = (
        client_for("viewer").get(f"/runs/{run.pk}/?q=value-333", **hx("run-live")).content.decode()
    )
    assert body.lstrip().startswith('<div id="run-live"')
    assert 'id="step-list"' in body and 'hx-swap-oob="true"' in body
    assert rows_in(body) == [333]


def test_a_search_that_matches_nothing_says_so(client_for, run):
    html = client_for("viewer").get(f"/runs/{run.pk}/?q=zzzz-nothing").content.decode()
    assert "No step matches this search." in html and rows_in(html) == []


@pytest.mark.parametrize(
    "query",
    [
        "kind=teleport",
        "call=maybe",
        "status=sleeping",
        "phase=dreaming",
        "tool=no_such_tool",
        "q=" + "x" * 201,
        "q=a%00b",
    ],
)
def test_a_bad_filter_value_is_a_400_with_a_form_error_never_a_500(client_for, run, query):
    client = client_for("viewer")
    page = client.get(f"/runs/{run.pk}/?{query}")
    assert page.status_code == 400
    assert "Search refused" in page.content.decode()
    fragment = client.get(f"/runs/{run.pk}/?{query}", **hx("run-live"))
    assert fragment.status_code == 400 and b"Search refused" in fragment.content
