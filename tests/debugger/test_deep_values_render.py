"""The pages draw any stored value, however deep, without recursion: a run whose input was
stored nested 500 deep (as an archive imported before the policy guarded imports could
hold) has a run page, a step page and a search that answer 200, each level reachable a
page of the tree at a time."""

from __future__ import annotations

import pytest

from agentrun.models import Run
from debugger.jsontree import TreeOptions, format_path, render_tree
from tests.debugger import runs

pytestmark = pytest.mark.django_db


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_value_nested_far_deeper_than_the_recursion_limit_renders():
    value: dict = {"leaf": "bottom"}
    for _ in range(5000):
        value = {"d": value}
    html = render_tree(value, TreeOptions(link=lambda path, start: f"/t?path={len(path)}"))
    # Drawn to the tree's depth limit, then a link to the subtree's own page.
    assert html.count('class="jt-node"') == 32
    assert 'href="/t?path=32"' in html
    assert "bottom" not in html


def test_the_subtree_page_draws_the_next_levels():
    value: dict = {"leaf": "bottom"}
    for _ in range(40):
        value = {"d": value}
    path = ("d",) * 32
    sub = value
    for key in path:
        sub = sub[key]
    html = render_tree(sub, TreeOptions(link=lambda p, s: format_path(p)), path=path)
    assert "bottom" in html


@pytest.fixture
def deep_run(people):
    run = runs.walkthrough_run(people["operator"])
    deep = {**run.input, "attachment": nested(500)}
    Run.objects.filter(pk=run.pk).update(input=deep)
    return run


def test_the_run_page_of_a_deep_input_answers_200(client_for, deep_run):
    response = client_for("viewer").get(f"/runs/{deep_run.pk}/")
    assert response.status_code == 200
    assert "attachment" in response.content.decode()


def test_the_step_page_and_the_search_answer_200(client_for, deep_run):
    client = client_for("viewer")
    assert client.get(f"/runs/{deep_run.pk}/steps/2/").status_code == 200
    assert client.get(f"/runs/{deep_run.pk}/?q=refund").status_code == 200
    assert client.get(f"/runs/{deep_run.pk}/steps/2/pre/").status_code == 200
    assert client.get(f"/runs/{deep_run.pk}/input.json").status_code == 200
