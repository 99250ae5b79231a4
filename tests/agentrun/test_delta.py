"""Tests for agentrun.store.delta: structural diff / copy-on-write patch of agent states."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.store.delta import DeltaError, canonical, diff, json_size, patch, state_hash

# --- strategies -------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=6), children, max_size=6)
    ),
    max_leaves=30,
)
# Smaller values for the items an edit adds, so edit sequences stay quick to generate.
item_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)
# Few distinct values, so lists repeat items and the realignment is exercised.
small_scalars = st.sampled_from([0, 1, True, False, 1.0, 0.0, -0.0, None, "a", ""])
small_lists = st.lists(small_scalars | st.lists(small_scalars, max_size=2), max_size=12)


def roundtrip(old, new):
    """Assert patch(old, diff(old, new)) is exactly new and nothing was mutated."""
    old_before, new_before = canonical(old), canonical(new)
    ops = diff(old, new)
    assert canonical(patch(old, ops)) == new_before
    # Ops are plain JSON and still work after a trip through it.
    assert canonical(patch(old, json.loads(json.dumps(ops)))) == new_before
    assert canonical(old) == old_before
    assert canonical(new) == new_before
    return ops


def message(i: int, text: str = "") -> dict:
    return {"role": "assistant", "content": f"message {i} " + (text or "lorem ipsum " * 20)}


# --- properties ---------------------------------------------------------------------


@settings(max_examples=300)
@given(json_values, json_values)
def test_patching_with_the_diff_of_two_random_values_gives_exactly_the_second(a, b):
    roundtrip(a, b)


@settings(max_examples=300)
@given(small_lists, small_lists)
def test_lists_with_many_repeated_items_still_round_trip_exactly(a, b):
    roundtrip(a, b)


@given(json_values)
def test_a_value_and_its_deep_copy_have_no_diff(a):
    assert diff(a, a) == []
    assert diff(a, copy.deepcopy(a)) == []
    assert diff(a, json.loads(json.dumps(a))) == []


def _containers(value, path=()):
    """Paths of every list and dict inside value."""
    if isinstance(value, dict):
        yield path
        for key, child in value.items():
            yield from _containers(child, (*path, key))
    elif isinstance(value, list):
        yield path
        for index, child in enumerate(value):
            yield from _containers(child, (*path, index))


def _update_at(value, path, fn):
    """A new value with fn applied at path, sharing everything else (like a reducer)."""
    if not path:
        return fn(value)
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _update_at(value[head], rest, fn)}
    out = list(value)
    out[head] = _update_at(value[head], rest, fn)
    return out


@st.composite
def edited_states(draw):
    """A random state and the result of a random sequence of agent-like edits."""
    start = draw(
        st.fixed_dictionaries(
            {
                "messages": st.lists(item_values, max_size=10),
                "memory": st.dictionaries(st.text(max_size=4), item_values, max_size=5),
                "misc": item_values,
            }
        )
    )
    state = start
    for _ in range(draw(st.integers(1, 6))):
        path = draw(st.sampled_from(list(_containers(state))))
        target = state
        for step in path:
            target = target[step]
        new_items = draw(st.lists(item_values, max_size=3))
        if isinstance(target, list):
            edit = draw(st.sampled_from(["append", "slide", "replace", "insert", "delete"]))
            if edit == "append":
                fn = lambda lst, items=new_items: [*lst, *items]  # noqa: E731
            elif edit == "slide":
                k = draw(st.integers(0, 3))
                fn = lambda lst, k=k, items=new_items: [*lst[k:], *items]  # noqa: E731
            elif not target:
                fn = lambda lst, items=new_items: items  # noqa: E731
            else:
                i = draw(st.integers(0, len(target) - 1))
                value = draw(item_values)
                if edit == "replace":
                    fn = lambda lst, i=i, v=value: [*lst[:i], v, *lst[i + 1 :]]  # noqa: E731
                elif edit == "insert":
                    fn = lambda lst, i=i, v=value: [*lst[:i], v, *lst[i:]]  # noqa: E731
                else:
                    fn = lambda lst, i=i: [*lst[:i], *lst[i + 1 :]]  # noqa: E731
        else:
            key = draw(st.sampled_from([*target, "new"]) if target else st.just("new"))
            if draw(st.booleans()) and key in target:
                fn = lambda d, key=key: {k: v for k, v in d.items() if k != key}  # noqa: E731
            else:
                value = draw(item_values)
                fn = lambda d, key=key, v=value: {**d, key: v}  # noqa: E731
        state = _update_at(state, path, fn)
    return start, state


@settings(max_examples=200)
@given(edited_states())
def test_diff_of_a_random_edit_sequence_patches_to_exactly_the_result(pair):
    start, end = pair
    roundtrip(start, end)
    # Same when nothing is shared by identity (old state loaded from storage).
    roundtrip(json.loads(json.dumps(start)), end)


# --- list shapes --------------------------------------------------------------------------


def test_unchanged_values_give_no_ops():
    state = {"messages": [message(0), message(1)], "phase": "plan", "n": 1.5}
    assert diff(state, state) == []
    assert diff(state, copy.deepcopy(state)) == []
    assert diff([], []) == []
    assert diff(None, None) == []


def test_an_append_is_one_splice_with_only_the_new_items():
    old = {"messages": [message(i) for i in range(100)], "phase": "act"}
    new_items = [message(100), message(101)]
    new = {**old, "messages": old["messages"] + new_items}
    ops = roundtrip(old, new)
    assert ops == [["splice", ["messages"], 100, 0, new_items]]


def test_an_append_to_an_equal_but_not_identical_list_is_still_one_splice():
    old = [message(i) for i in range(20)]
    new = json.loads(json.dumps(old)) + [message(20)]
    assert roundtrip(old, new) == [["splice", [], 20, 0, [message(20)]]]


def test_a_sliding_window_is_two_small_splices_far_below_the_list_size():
    old = [message(i) for i in range(40)]
    new = old[1:] + [message(40), message(41)]
    ops = roundtrip(old, new)
    assert ops == [["splice", [], 0, 1, []], ["splice", [], 39, 0, [message(40), message(41)]]]
    assert json_size(ops) < json_size(new) / 10


def test_a_sliding_window_of_scalars_is_also_found():
    old = list(range(1000, 1050))
    new = old[3:] + [7, 8, 9]
    assert roundtrip(old, new) == [["splice", [], 0, 3, []], ["splice", [], 47, 0, [7, 8, 9]]]


def test_an_item_inserted_or_removed_in_the_middle_is_one_splice():
    old = [message(i) for i in range(30)]
    assert roundtrip(old, [*old[:10], message(99), *old[10:]]) == [
        ["splice", [], 10, 0, [message(99)]]
    ]
    assert roundtrip(old, old[:10] + old[12:]) == [["splice", [], 10, 2, []]]


def test_a_nested_change_inside_a_list_element_gives_a_path_into_it():
    old = {"messages": [message(i) for i in range(5)]}
    messages = list(old["messages"])
    messages[2] = {**messages[2], "content": "edited"}
    ops = roundtrip(old, {"messages": messages})
    assert ops == [["set", ["messages", 2, "content"], "edited"]]


def test_a_changed_scalar_in_a_list_is_set_in_place():
    assert roundtrip([1, 2, 3, 4], [1, 2, 30, 4]) == [["set", [2], 30]]


def test_a_whole_list_replaced_is_one_splice():
    assert roundtrip([1, 2, 3], ["x", "y"]) == [["splice", [], 0, 3, ["x", "y"]]]


# --- JSON types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (1, True),
        (True, 1),
        (0, False),
        (1, 1.0),
        (0.0, -0.0),
        ({"x": 1}, {"x": True}),
        ([1, 2], [True, 2]),
        ([[0.0]], [[-0.0]]),
        ({"a": [1]}, {"a": [1.0]}),
    ],
)
def test_a_bool_or_float_replacing_an_equal_int_still_produces_an_op(old, new):
    assert old == new  # Python thinks so, JSON does not
    ops = roundtrip(old, new)
    assert ops != []
    assert canonical(patch(old, ops)) == canonical(new)


def test_a_type_change_at_the_root_replaces_the_whole_value():
    assert diff({"a": 1}, [1]) == [["set", [], [1]]]
    assert patch({"a": 1}, [["set", [], [1]]]) == [1]


def test_dict_keys_are_set_and_deleted_individually():
    old = {"a": 1, "b": {"c": 2, "d": 3}}
    new = {"a": 1, "b": {"c": 2, "e": 4}}
    assert roundtrip(old, new) == [["del", ["b", "d"]], ["set", ["b", "e"], 4]]


# --- patch ------------------------------------------------------------------------------


def test_patch_does_not_mutate_its_input_and_shares_untouched_subtrees():
    old = {
        "messages": [message(i) for i in range(5)],
        "memory": {"notes": {"a": "x" * 50}},
        "tool_calls": [{"tool": "search", "args": {"q": "x"}}],
    }
    before = canonical(old)
    messages = list(old["messages"])
    messages[1] = {**messages[1], "content": "changed"}
    new = {**old, "messages": messages + [message(5)]}
    result = patch(old, diff(old, new))
    assert canonical(old) == before
    assert canonical(result) == canonical(new)
    assert result is not old
    assert result["messages"] is not old["messages"]
    assert result["memory"] is old["memory"]
    assert result["tool_calls"] is old["tool_calls"]
    assert result["messages"][0] is old["messages"][0]
    assert result["messages"][1] is not old["messages"][1]


def test_patch_with_no_ops_returns_the_value_itself():
    value = {"a": [1, 2]}
    assert patch(value, []) is value


def test_patch_does_not_mutate_values_held_by_the_ops():
    inserted = {"k": [1]}
    ops = [["set", ["x"], inserted], ["splice", ["x", "k"], 1, 0, [2]]]
    assert patch({}, ops) == {"x": {"k": [1, 2]}}
    assert inserted == {"k": [1]}


@pytest.mark.parametrize(
    "op",
    [
        "set",
        [],
        ["nope", []],
        ["set", []],
        ["set", "a", 1],
        ["set", [1.5], 1],
        ["set", ["missing", "x"], 1],
        ["set", ["list", 5], 1],
        ["set", ["list", -1], 1],
        ["set", ["list", True], 1],
        ["set", ["list", "0"], 1],
        ["set", ["n", "x"], 1],
        ["del", []],
        ["del", ["missing"]],
        ["del", ["list", 0]],
        ["splice", ["n"], 0, 0, []],
        ["splice", ["d"], 0, 0, []],
        ["splice", ["list"], 4, 0, []],
        ["splice", ["list"], 1, 3, []],
        ["splice", ["list"], -1, 0, []],
        ["splice", ["list"], 0, -1, []],
        ["splice", ["list"], 0, 0, "ab"],
        ["splice", ["list"], 0, 0],
    ],
)
def test_an_op_that_does_not_fit_raises_delta_error(op):
    value = {"list": [1, 2, 3], "n": 5, "d": {"k": 1}}
    before = canonical(value)
    with pytest.raises(DeltaError):
        patch(value, [op])
    assert canonical(value) == before


def test_delta_error_is_a_value_error():
    assert issubclass(DeltaError, ValueError)


# --- canonical form -------------------------------------------------------------------------


def test_canonical_form_sorts_keys_and_keeps_unicode():
    assert canonical({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
    assert state_hash({"b": 1, "a": 2}) == state_hash({"a": 2, "b": 1})
    assert len(state_hash(None)) == 64


@given(json_values)
def test_json_size_is_the_length_of_the_canonical_bytes(value):
    assert json_size(value) == len(canonical(value))
