"""The incremental Merkle hash equals the hash of the whole value, always."""

import json
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.store import delta, hashing
from tests.agentrun.test_delta import json_values

WORKLOAD = Path(__file__).resolve().parents[3] / "shared" / "bench"


def canonical_size(value):
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


@settings(max_examples=300, deadline=None)
@given(json_values, json_values)
def test_applying_a_delta_to_the_tree_gives_the_hash_and_size_of_the_result(old, new):
    node = hashing.build(old)
    before = node.hex
    updated = hashing.apply(node, delta.diff(old, new))
    assert updated.hex == hashing.digest(new)
    assert updated.size == canonical_size(new)
    assert node.hex == before  # the old tree is untouched


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.dictionaries(st.text(max_size=3), json_values, max_size=3), min_size=2, max_size=8),
    st.data(),
)
def test_editing_a_list_item_and_then_splicing_before_it_keeps_the_hash_right(items, data):
    new_items = [dict(x) for x in items]
    i = data.draw(st.integers(0, len(items) - 1))
    new_items[i] = {**new_items[i], "edited": True}
    new_items.insert(0, {"inserted": 1})
    ops = [["set", [i, "edited"], True], ["splice", [], 0, 0, [{"inserted": 1}]]]
    assert delta.canonical(delta.patch(items, ops)) == delta.canonical(new_items)
    assert hashing.apply(hashing.build(items), ops).hex == hashing.digest(new_items)


def test_equal_states_hash_equal_whatever_their_key_order():
    assert hashing.digest({"a": 1, "b": [1, "x"]}) == hashing.digest({"b": [1, "x"], "a": 1})
    assert hashing.digest({"a": 1}) != hashing.digest({"a": True})
    assert hashing.digest([1]) != hashing.digest({"0": 1})


def test_the_workload_step_hashes_incrementally():
    # The shared workload beside the repository, else the verbatim copy in bench/.
    folder = (
        WORKLOAD
        if (WORKLOAD / "workload.py").exists()
        else Path(__file__).resolve().parents[2] / "bench"
    )
    sys.path.insert(0, str(folder))
    import workload

    for variant in ("grow", "flat"):
        state = workload.build_state(60, variant)
        node = hashing.build(state)
        for k in range(61, 70):
            nxt = workload.apply_delta(state, workload.step_delta(k, variant), variant)
            node = hashing.apply(node, delta.diff(state, nxt))
            state = nxt
        assert node.hex == hashing.digest(state)
        assert node.size == workload.json_size(state)


def test_a_lone_surrogate_hashes_like_any_other_string():
    # JSON can carry one ("\ud800"), and redaction and storage keep it as is.
    a, b = {"s": "x\ud800y", "k\udfff": 1}, {"k\udfff": 1, "s": "x\ud800y"}
    assert hashing.digest(a) == hashing.digest(b) == delta.state_hash(a)
    assert hashing.digest(a) != hashing.digest({"s": "x\ud801y", "k\udfff": 1})
    node = hashing.build({"s": "x"})
    ops = delta.diff({"s": "x"}, a)
    assert hashing.apply(node, ops).hex == hashing.digest(a)
