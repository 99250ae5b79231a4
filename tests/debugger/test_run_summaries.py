"""Runs without a goal are summed up (their agent's summary hook, else their first input
field) on the run list and the run page; the watch box suggests paths of this run."""

from __future__ import annotations

import html as htmllib
import re

import pytest

from agentrun.agents import AGENTS, StateAgent
from agentrun.models import Run
from tests.base import play_incident

pytestmark = pytest.mark.django_db


class Glossary(StateAgent):
    """An agent with its own summary of a run's input."""

    name = "glossary-with-summary"

    def summary(self, input):
        return f"define {input.get('word', '')!r}"


@pytest.fixture(autouse=True)
def _glossary(monkeypatch):
    monkeypatch.setitem(AGENTS, Glossary.name, Glossary())


def text(response) -> str:
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())))


def goal_cells(response) -> list[str]:
    cells = re.findall(
        r'<td class="goal[^"]*"[^>]*><span class="clip">(.*?)</span>', response.content.decode()
    )
    return [htmllib.unescape(c) for c in cells]


def test_a_run_without_a_goal_shows_its_agents_summary_or_its_first_field(client_for, people):
    Run.objects.create(agent="glossary-with-summary", input={"word": "serendipity"})
    # An agent this deployment does not know: the input's first field, its secrets redacted.
    Run.objects.create(
        agent="inventory", input={"sku": "A-1 api_key=sk-live-abcdefghijklmnop1234", "qty": 3}
    )
    Run.objects.create(agent="inventory", input={"goal": "count the shelves", "qty": 3})
    cells = goal_cells(client_for("viewer").get("/"))
    assert "define 'serendipity'" in cells
    assert "count the shelves" in cells
    [first_field] = [c for c in cells if c.startswith("sku: ")]
    assert "A-1" in first_field and "sk-live" not in first_field


def test_the_run_page_says_summary_when_there_is_no_goal(client_for, people):
    run = Run.objects.create(agent="glossary-with-summary", input={"word": "serendipity"})
    page = text(client_for("viewer").get(f"/runs/{run.pk}/"))
    assert "Summary define 'serendipity'" in page
    assert "Goal" not in page.split("Summary", 1)[0].split("Run ", 1)[-1]


def test_a_huge_input_is_not_read_for_the_run_list(client_for, people):
    Run.objects.create(agent="inventory", input={"blob": "x" * 200_000})
    assert goal_cells(client_for("viewer").get("/")) == [""]


def test_the_watch_box_suggests_paths_this_step_changed(client_for, people):
    incident = play_incident()
    body = client_for("viewer").get(f"/runs/{incident.pk}/steps/3/").content.decode()
    form = re.search(r'<form class="inline-form watch-from-step".*?</form>', body, re.S).group(0)
    options = re.findall(r'<option value="([^"]+)">', form)
    assert options[0] == "memory.notes.recommendation"  # what step 3 changed, deepest first
    assert 'placeholder="a path, e.g. memory.notes.recommendation"' in form
    body = client_for("viewer").get(f"/runs/{incident.pk}/steps/2/").content.decode()
    form = re.search(r'<form class="inline-form watch-from-step".*?</form>', body, re.S).group(0)
    assert "memory.notes.cart" in re.findall(r'<option value="([^"]+)">', form)
    # Not a shop path on another agent's run.
    run = Run.objects.create(agent="glossary-with-summary", input={"word": "serendipity"})
    page = client_for("viewer").get(f"/runs/{run.pk}/watch/").content.decode()
    assert "memory.notes.cart" not in page


def test_compare_suggests_paths_of_the_fork_not_a_shop_path(client_for, people):
    from agentrun.lifecycle import services
    from tests.base import drive
    from tests.debugger import runs

    parent = runs.walkthrough_run(people["operator"])
    fork = drive(services.fork_run(parent, step=3, at="pre", user=people["operator"]))
    body = client_for("viewer").get(f"/runs/{fork.pk}/compare/").content.decode()
    box = re.search(r'<input id="compare-watch-path".*?</datalist>', body, re.S).group(0)
    assert "memory.notes.cart" not in box
    assert re.findall(r'<option value="([^"]+)">', box)
