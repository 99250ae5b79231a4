"""debugger.diffs: what changed between two states, readable, and fast on big states."""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import pytest

from debugger.diffs import MISSING, SnapshotRef, SpecError, diff_states, text_diff


def ops(diff):
    return [(c.op, c.path_text) for c in diff.changes]


def test_added_removed_and_changed_keys_with_old_and_new_values():
    old = {"memory": {"notes": {"a": 1, "b": 2}}, "phase": "planning"}
    new = {"memory": {"notes": {"a": 1, "c": 3, "d": 4, "e": 5}}, "phase": "executing"}
    diff = diff_states(old, new)
    assert sorted(ops(diff)) == [
        ("added", "memory.notes.c"),
        ("added", "memory.notes.d"),
        ("added", "memory.notes.e"),
        ("changed", "phase"),
        ("removed", "memory.notes.b"),
    ]
    phase = next(c for c in diff.changes if c.op == "changed")
    assert (phase.old, phase.new) == ("planning", "executing")
    assert diff.summary == "3 added, 1 removed, 1 changed across memory, phase"


def test_the_summary_names_the_common_place():
    old = {"memory": {"notes": {"a": "x"}}, "history": []}
    new = {"memory": {"notes": {"a": "y", "b": 1, "c": 2, "d": 3}}, "history": []}
    assert diff_states(old, new).summary == "3 added, 1 changed in memory.notes"


def test_list_appends_are_appended_items_not_a_rewritten_list():
    old = {"history": [{"role": "user", "content": "hi"}]}
    new = {
        "history": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "b"},
        ]
    }
    diff = diff_states(old, new)
    [change] = diff.changes
    assert (change.op, change.path_text, change.index) == ("appended", "history", 1)
    assert change.items == new["history"][1:]
    assert diff.summary == "2 added in history"


def test_inserts_and_removals_inside_a_list():
    old = {"plan": list(range(20))}
    new = {"plan": [0, 1, 2, "x", *range(3, 13), *range(14, 20)]}
    diff = diff_states(old, new)
    assert ops(diff) == [("inserted", "plan"), ("dropped", "plan")]
    inserted, dropped = diff.changes
    assert (inserted.index, inserted.items) == (3, ["x"])
    assert (dropped.index, dropped.items) == (13, [13])


def test_a_changed_item_in_a_shifted_list_is_found_at_its_place():
    old = {"history": [{"c": "a"}, {"c": "b"}, {"c": "c"}, {"c": "d"}, {"c": "e"}]}
    new = {"history": [{"c": "new"}, {"c": "a"}, {"c": "b"}, {"c": "c"}, {"c": "D!"}, {"c": "e"}]}
    diff = diff_states(old, new)
    # The old value is read from the old list, where "d" sat one place earlier.
    assert [(c.op, c.path_text, c.old, c.new) for c in diff.changes] == [
        ("inserted", "history", MISSING, MISSING),
        ("changed", "history[4].c", "d", "D!"),
    ]


def test_a_type_change_is_reported_as_such():
    [change] = diff_states({"final_answer": None}, {"final_answer": "done"}).changes
    assert (
        change.type_changed
        and change.old_preview.kind == "null"
        and change.new_preview.kind == "string"
    )


def test_long_strings_get_an_inline_word_diff():
    old = "The parcel arrived damaged; the photo shows a broken corner and water stains on the box."
    new = "The parcel arrived damaged; the video shows a broken corner and water stains on the box."
    [change] = diff_states({"note": old}, {"note": new}).changes
    assert ("del", "photo") in change.text_diff and ("ins", "video") in change.text_diff
    assert short_strings_have_no_text_diff()


def short_strings_have_no_text_diff() -> bool:
    [change] = diff_states({"a": "x"}, {"a": "y"}).changes
    return change.text_diff is None


def test_long_unchanged_stretches_are_shortened():
    base = "word " * 200
    parts = text_diff(base + "old", base + "new")
    assert parts[0][0] == "gap" and "unchanged chars" in parts[0][1]
    assert ("del", "old") in parts and ("ins", "new") in parts


def test_identical_states():
    state = {"a": [1, 2, {"b": None}]}
    diff = diff_states(state, copy.deepcopy(state))
    assert diff.identical and diff.summary == "identical"


def test_previews_are_cut_and_keep_the_full_value():
    [change] = diff_states({}, {"big": {"text": "x" * 1000}}).changes
    preview = change.new_preview
    assert len(preview.short) < 300 and preview.short.endswith("…")
    assert "x" * 1000 in preview.full


def test_snapshot_references_parse_and_print():
    ref = SnapshotRef.parse("7f0c1b36-3d55-4a0e-9d6f-4f3f2bb0c1de:12:post")
    assert (ref.step, ref.at) == (12, "post")
    assert str(ref) == "7f0c1b36-3d55-4a0e-9d6f-4f3f2bb0c1de:12:post"
    run = "7f0c1b36-3d55-4a0e-9d6f-4f3f2bb0c1de"
    odd_numbers = (f"{run}:²:pre", f"{run}:٣:post", f"{run}:{'9' * 5000}:pre")
    for bad in ("", "x:1:pre", f"{run}:1:middle", "a:b:c:d", *odd_numbers):
        with pytest.raises(SpecError):
            SnapshotRef.parse(bad)


def _workload():
    sys.path.insert(0, str(Path("/work/shared/bench")))
    try:
        import workload
    except ImportError:
        pytest.skip("the shared benchmark workload is not available")
    return workload


def test_two_big_states_with_a_small_difference_diff_well_under_a_second():
    workload = _workload()
    old = workload.build_state(1000, "grow")
    new = copy.deepcopy(old)  # no shared objects: the slow case for the structural diff
    new["memory"]["notes"]["note_03"] = new["memory"]["notes"]["note_03"] + " (edited)"
    new["messages"].append({"role": "user", "content": "one more thing"})
    started = time.perf_counter()
    diff = diff_states(old, new, old_size=2_556_318, new_size=2_556_400)
    elapsed = time.perf_counter() - started
    assert diff.summary == "1 added, 1 changed across memory, messages"
    assert elapsed < 0.5, f"{elapsed:.3f}s"
