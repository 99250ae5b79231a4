"""A diff's changes grouped by top-level key: counts per group, big groups collapsed."""

from __future__ import annotations

import re

import pytest
from django.template.loader import render_to_string

from debugger import diffs
from debugger.diffs import diff_states
from tests.debugger import runs

OLD = {
    "memory": {"goal": "pack", "notes": {f"n{i}": i for i in range(40)}},
    "history": [{"role": "user", "text": "hi"}],
    "phase": "planning",
    "scratch": {"a": 1},
}
NEW = {
    "memory": {"goal": "pack light", "notes": {f"n{i}": i + 1 for i in range(30)}},
    "history": [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "ok"}],
    "phase": "executing",
}


def test_changes_are_grouped_by_top_level_key_with_counts():
    diff = diff_states(OLD, NEW)
    groups = {g.key: g for g in diff.groups}
    assert list(groups) == [g.key for g in diff.groups]
    assert set(groups) == {"memory", "history", "phase", "scratch"}
    assert groups["memory"].counts == {"added": 0, "removed": 10, "changed": 31}
    assert groups["memory"].summary == "10 removed, 31 changed"
    assert groups["history"].summary == "1 added"
    assert groups["scratch"].summary == "1 removed"
    assert sum(len(g.changes) for g in diff.groups) == len(diff.changes)


def test_a_group_counts_say_what_was_counted_and_where():
    # Three list items dropped inside one tool call: not three tool calls removed.
    old = {"tool_calls": [{"args": {"skus": ["A"]}, "result": {"for": ["A"], "recs": ["x"]}}]}
    new = {"tool_calls": [{"args": {"skus": []}, "result": {"for": [], "recs": []}}]}
    [group] = diff_states(old, new).groups
    assert [c.text for c in group.chips] == ["−3 list items in tool_calls[0]"]
    assert group.chips[0].title == "3 list items removed inside tool_calls[0]"
    # Whole calls dropped from the list: items of the group's own list, no place needed.
    [group] = diff_states({"tool_calls": [1, 2, 3]}, {"tool_calls": [1]}).groups
    assert [c.text for c in group.chips] == ["−2 list items"]
    chips = {g.key: [c.text for c in g.chips] for g in diff_states(OLD, NEW).groups}
    assert chips["memory"] == ["−10 keys in memory.notes", "~31 values"]
    assert chips["scratch"] == ["−1 key"]
    assert chips["history"] == ["+1 list item"]
    html = render_to_string("debugger/_diff.html", {"diff": diff_states(OLD, NEW), "view": "diff"})
    assert "−10 keys in memory.notes</span>" in html and "−10 removed" not in html


def test_big_groups_start_collapsed_small_ones_open():
    groups = {g.key: g for g in diff_states(OLD, NEW).groups}
    assert not groups["memory"].open
    assert groups["history"].open and groups["phase"].open


def test_a_group_says_where_its_changes_are():
    groups = {g.key: g for g in diff_states(OLD, NEW).groups}
    assert sorted(groups["memory"].inside.split(", ")) == ["goal ~1", "notes −10 ~30"]
    assert groups["history"].inside == ""  # an append to the list itself
    wide = diff_states({"m": {}}, {"m": {f"k{i}": i for i in range(6)}})
    assert wide.groups[0].inside == "k0 +1, k1 +1, k2 +1, k3 +1 and 2 more"


def test_a_small_diff_is_all_open():
    old = {"memory": {f"k{i}": i for i in range(12)}}
    new = {"memory": {f"k{i}": -i for i in range(1, 12)}}
    [group] = diff_states(old, new).groups
    assert len(group.changes) == 12 and group.open


def test_changes_to_the_state_itself_are_one_group():
    [group] = diff_states([1, 2], {"a": 1}).groups
    assert group.key == "$" and group.summary == "1 changed"


def test_only_so_many_changes_are_shown_in_all(monkeypatch):
    monkeypatch.setattr(diffs, "SHOWN_MAX", 25)
    diff = diff_states(OLD, NEW)
    assert sum(len(g.shown) for g in diff.groups) == 25
    assert diff.hidden == len(diff.changes) - 25
    assert sum(g.hidden for g in diff.groups) == diff.hidden


@pytest.mark.django_db
def test_a_big_diff_page_collapses_its_big_groups(client_for, people):
    a = runs.walkthrough_run(people["operator"])
    b = runs.walkthrough_run(people["operator"], evidence="signed delivery note")
    html = client_for("viewer").get(f"/diff/?a={a.pk}:1:post&b={b.pk}:1:post").content.decode()
    # Two groups here (history, tool_calls), both small: open, listed at the top.
    assert len(re.findall(r'<details class="dgroup" id="dg-\d+" open>', html)) == 2
    assert 'href="#dg-1" data-open="dg-1"><code>history</code>' in html

    diff = diff_states(OLD, NEW)
    html = render_to_string("debugger/_diff.html", {"diff": diff, "view": "edit"})
    opened = re.findall(r'<details class="dgroup" id="dg-(\d+)"( open)?>', html)
    keys = [g.key for g in diff.groups]
    assert {keys[int(n) - 1]: bool(o) for n, o in opened} == {
        "memory": False,
        "history": True,
        "phase": True,
        "scratch": True,
    }
    assert "41 changes in " in html and ": click to show" in html
    assert html.count('class="chg chg-') == len(diff.changes)
