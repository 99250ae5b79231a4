"""The watch page (/runs/<id>/watch/?path=...), the tree's history links, the step view's
link block and compare's watched path."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest

from agentrun.lifecycle import services
from agentrun.store import snapshots
from tests.base import drive, play_incident

pytestmark = pytest.mark.django_db


@pytest.fixture
def incident(people):
    return play_incident()


@pytest.fixture
def fork(incident, people):
    state = snapshots.load(incident.pk, 3, "pre")
    state["memory"]["notes"]["cart"] = json.dumps([{"sku": "TENT-2P", "qty": 1}])
    run = services.fork_run(incident, step=3, at="pre", state=state, user=people["operator"])
    return drive(run, through_backoff=True)


def text(response) -> str:
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", response.content.decode()))


def entries(response) -> list[str]:
    return re.findall(r'<li id="change-(\d+)"', response.content.decode())


def test_the_cart_note_changed_once_at_step_2(client_for, incident):
    response = client_for("viewer").get(
        f"/runs/{incident.pk}/watch/", {"path": "memory.notes.cart"}
    )
    assert response.status_code == 200
    page = text(response)
    assert "Changed once" in page
    assert "— added at step 2, and never again." in re.sub(r"\s+", " ", page)
    assert entries(response) == ["0"]
    body = response.content.decode()
    assert f'href="/runs/{incident.pk}/steps/2/"' in body  # the step, one click away
    assert f'href="/runs/{incident.pk}/steps/2/diff/"' in body
    assert "Reading ben&#x27;s cart." in body or "Reading ben's cart." in body
    assert "STOVE-1" in page


def test_every_change_links_to_the_previous_and_next_one(client_for, incident):
    response = client_for("viewer").get(f"/runs/{incident.pk}/watch/", {"path": "iteration"})
    body = response.content.decode()
    assert entries(response) == [str(i) for i in range(10)]
    assert 'href="?path=iteration&amp;page=1#change-4" title="The previous change' in body
    assert 'href="?path=iteration&amp;page=1#change-6" title="The next change' in body


def test_from_a_step_it_shows_the_previous_and_next_change(client_for, incident):
    response = client_for("viewer").get(
        f"/runs/{incident.pk}/watch/", {"path": "memory.notes.recommendation", "step": "5"}
    )
    page = re.sub(r"\s+", " ", text(response))
    assert "previous change: step 3" in page
    assert "step 5 did not change it" in page
    assert "no change after step 5" in page


def test_the_step_view_has_a_watch_form_that_leads_there(client_for, incident):
    body = client_for("viewer").get(f"/runs/{incident.pk}/steps/5/").content.decode()
    form = re.search(r'<form class="inline-form watch-from-step".*?</form>', body, re.S).group(0)
    assert f'action="/runs/{incident.pk}/watch/"' in form
    assert 'name="step" value="5"' in form


def test_every_value_in_a_snapshot_tree_links_to_its_history(client_for, incident):
    body = client_for("viewer").get(f"/runs/{incident.pk}/steps/3/pre/").content.decode()
    assert (
        f'<a class="jt-watch" href="/runs/{incident.pk}/watch/?path=memory.notes.cart&amp;step=3"'
        in body
    )


def test_a_path_that_never_existed_says_so(client_for, incident):
    response = client_for("viewer").get(
        f"/runs/{incident.pk}/watch/", {"path": "/memory/notes/basket"}
    )
    assert response.status_code == 200
    assert "memory.notes.basket never existed" in re.sub(r"\s+", " ", text(response))
    assert entries(response) == []


@pytest.mark.parametrize(
    ("path", "says"),
    [("memory..notes", "expected a key"), ("x" * 10_000, "10,000 characters long")],
)
def test_a_bad_path_is_a_form_error_with_a_400(client_for, incident, path, says):
    response = client_for("viewer").get(f"/runs/{incident.pk}/watch/", {"path": path})
    assert response.status_code == 400
    body = response.content.decode()
    assert 'role="alert"' in body and says in body
    assert 'aria-invalid="true"' in body


def test_without_a_path_the_page_asks_for_one(client_for, incident):
    response = client_for("viewer").get(f"/runs/{incident.pk}/watch/")
    assert response.status_code == 200
    assert "Name a value of the run" in text(response)


def test_outsiders_and_strangers_are_kept_out(client_for, incident):
    assert client_for(None).get(f"/runs/{incident.pk}/watch/?path=memory").status_code == 302
    assert client_for("outsider").get(f"/runs/{incident.pk}/watch/?path=memory").status_code == 403


def test_a_fork_shows_the_inherited_change_and_its_own_edit(client_for, fork, incident):
    response = client_for("viewer").get(f"/runs/{fork.pk}/watch/", {"path": "memory.notes.cart"})
    body = response.content.decode()
    assert entries(response) == ["0", "1"]
    assert "inherited from" in body
    assert f'href="/runs/{incident.pk}/steps/2/"' in body
    assert f'href="/runs/{fork.pk}/steps/3/"' in body


def test_each_change_replays_from_the_state_it_left_for_operators(client_for, fork, incident):
    url = f"/runs/{fork.pk}/watch/?path=memory.notes.cart"
    body = client_for("operator").get(url).content.decode()
    links = re.findall(r'<a class="btn small replay" href="([^"]+)"[^>]*>([^<]+)</a>', body)
    # The parent's change after its step 2, the fork's edit before its step 3.
    assert links == [
        (f"/runs/{incident.pk}/steps/2/post/fork/", "Replay from after step 2"),
        (f"/runs/{fork.pk}/steps/3/pre/fork/", "Replay from before step 3"),
    ]
    assert client_for("operator").get(links[1][0]).status_code == 200
    assert 'data-action="replay"' not in client_for("viewer").get(url).content.decode()


def test_compare_shows_the_watched_path_in_fork_and_parent_side_by_side(client_for, fork):
    response = client_for("viewer").get(f"/runs/{fork.pk}/compare/", {"path": "memory.notes.cart"})
    assert response.status_code == 200
    body = response.content.decode()
    table = re.search(r'<table class="grid watch-side">.*?</table>', body, re.S).group(0)
    rows = re.findall(r"<tr>\s*<td class=\"num\">.*?</tr>", table, re.S)
    cells = [re.findall(r"<td>(.*?)</td>", row, re.S) for row in rows]
    # step 2: the parent read the cart (the fork inherits it: shown once, in the parent's column)
    assert "STOVE-1" in cells[0][0] and "the same (inherited)" in cells[0][1]
    # step 3, before it ran: the fork's corrected cart; the parent did nothing there
    assert "—" in cells[1][0] and "TENT-2P" in cells[1][1] and "STOVE-1" not in cells[1][1]
    now = re.search(r'<tr class="watch-now">.*?</tr>', table, re.S).group(0)
    assert "differs" in now
    left, right = re.findall(r"<td>(.*?)</td>", now, re.S)
    assert "STOVE-1" in left and "STOVE-1" not in right


def test_compare_refuses_a_bad_watched_path_with_a_400(client_for, fork):
    response = client_for("viewer").get(f"/runs/{fork.pk}/compare/", {"path": "a[b"})
    assert response.status_code == 400
    assert 'role="alert"' in response.content.decode()


def test_a_long_history_pages_and_says_more_than_the_changes_shown(client_for, monkeypatch):
    from agentrun.store import watch
    from debugger import views

    monkeypatch.setattr(watch, "COUNTED", 3)
    monkeypatch.setattr(views, "WATCH_PER_PAGE", 3)
    run = play_incident()
    client = client_for("viewer")

    first = client.get(f"/runs/{run.pk}/watch/", {"path": "iteration"}).content.decode()
    assert "Changed more than 3 times" in first
    assert "changes 1–3 of more than 3" in first and "page=2" in first
    last = client.get(f"/runs/{run.pk}/watch/", {"path": "iteration", "page": "4"})
    html = last.content.decode()
    assert "Changed 10 times" in html and "changes 10–10 of 10" in html
    assert "later →" not in html and "page=3" in html


@pytest.mark.parametrize("param", ["page", "step"])
@pytest.mark.parametrize("value", ["²", "٣", "9" * 5000])
def test_a_number_that_is_not_ascii_digits_is_ignored_not_a_500(client_for, incident, param, value):
    # str.isdigit() holds for "²" and "٣", which int() refuses or reads otherwise.
    response = client_for("viewer").get(
        f"/runs/{incident.pk}/watch/", {"path": "memory.notes.cart", param: value}
    )
    assert response.status_code == 200
    assert "Changed once" in text(response)
