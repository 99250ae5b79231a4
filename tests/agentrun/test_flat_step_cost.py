"""A StateAgent step costs what it changes, not the size of the run's state.

The typed state a step's update made is taken over by the next step (no rebuild from the
dict, no walk over the whole history); validate_state checks only what a step added; a
long list's hash is extended by the appended items. None of it may change a result: the
same states, the same hashes, the same refusals.
"""

from __future__ import annotations

import json
import random

import pytest

from agentrun.agents import _TYPED, CallResult, Decision, StepContext, get_agent
from agentrun.state import AgentState, StateError, validate_successor
from agentrun.store import delta, hashing


def results_for(step: int) -> list[CallResult]:
    return [
        CallResult(
            index=0, tool="echo", kind="read", args={"n": step}, status="ok", result={"n": step}
        )
    ]


def decision(step: int) -> Decision:
    from agentrun.agents import Call

    return Decision(thought=f"step {step}", calls=[Call("echo", {"n": step})])


def run_steps(agent, state: dict, first: int, last: int, check: bool = True) -> dict:
    for k in range(first, last + 1):
        ctx = StepContext(run_id="r", step=k, input={})
        new = agent.update(state, decision(k), results_for(k), ctx)
        if check:
            agent.validate_state(new)
        state = new
    return state


def test_taking_the_typed_state_over_builds_the_same_states_as_rebuilding_it():
    agent = get_agent("scripted")
    start = agent.initial_state({"goal": "g"})
    fast = run_steps(agent, start, 1, 150)
    slow = start
    for k in range(1, 151):  # a fresh dict each step: no typed state to take over
        ctx = StepContext(run_id="r", step=k, input={})
        slow = agent.update(delta.patch(slow, []) | {}, decision(k), results_for(k), ctx)
    assert delta.canonical(fast) == delta.canonical(slow)
    assert AgentState.from_dict(fast).to_dict() == fast


def test_the_previous_state_is_never_changed_by_the_next_step():
    agent = get_agent("scripted")
    state = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 3)
    frozen = delta.canonical(state)
    run_steps(agent, state, 4, 6)
    assert delta.canonical(state) == frozen


def test_a_typed_state_is_taken_over_once_and_only_after_its_state_was_checked():
    agent = get_agent("scripted")
    s1 = agent.update(
        agent.initial_state({"goal": "g"}), decision(1), results_for(1), StepContext("r", 1, {})
    )
    # Not checked yet: the next update would rebuild it from the dict.
    assert not _TYPED.is_checked(s1)
    agent.validate_state(s1)
    assert _TYPED.is_checked(s1)
    st = agent._load_for_update(s1)
    assert not _TYPED.is_checked(s1)  # taken: a second step from s1 rebuilds
    again = agent._load_for_update(s1)
    assert st is not again
    assert st.to_dict() == again.to_dict() == s1


def test_a_state_whose_recorded_item_was_replaced_is_checked_in_full():
    agent = get_agent("scripted")
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 3)
    bad = dict(s1)
    bad["history"] = [*s1["history"][:1], {"role": "bot", "content": "x"}, *s1["history"][2:]]
    with pytest.raises(StateError, match=r"history\[1\]\.role must be one of"):
        validate_successor(s1, bad)


def test_a_bad_new_item_is_refused_with_its_real_position():
    agent = get_agent("scripted")
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 3)
    bad = dict(s1)
    bad["decisions"] = [*s1["decisions"], {"step": -1, "thought": "x"}]
    with pytest.raises(StateError, match=r"decisions\[3\]\.step must be >= 0"):
        validate_successor(s1, bad)
    with pytest.raises(StateError, match=r"decisions\[3\]\.step must be >= 0"):
        AgentState.from_dict(bad)


def test_a_bad_memory_or_phase_is_refused_like_from_dict_does():
    agent = get_agent("scripted")
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 2)
    for bad, says in (
        ({**s1, "memory": {**s1["memory"], "notes": {"a": 1}}}, "memory.notes.a must be a string"),
        ({**s1, "phase": "dancing"}, "unknown phase"),
        ({**s1, "surprise": 1}, "is not a state field"),
    ):
        with pytest.raises(StateError, match=says):
            validate_successor(s1, bad)


def test_an_updates_state_that_its_hook_broke_is_refused_by_validate_state():
    from agentrun.agents import StateAgent

    class Sloppy(StateAgent):
        name = "sloppy-test"

        def observe(self, st, decision, results, ctx):
            st.history.append({"role": "narrator", "content": "oops"})  # bypasses add_message

    agent = Sloppy()
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 1, check=False)
    with pytest.raises(StateError, match="role must be one of"):
        agent.validate_state(s1)


def test_list_hashes_extended_by_appends_equal_hashes_built_from_scratch():
    rng = random.Random(11)
    state = {"log": [{"i": i} for i in range(200)], "m": {"x": list(range(70))}}
    node = hashing.build(state)
    for step in range(600):
        log = list(state["log"])
        r = rng.random()
        if r < 0.5:
            log.append({"i": step})
        elif r < 0.6 and log:
            log.pop(rng.randrange(len(log)))
        elif r < 0.7 and log:
            log[rng.randrange(len(log))] = {"j": step}
        elif r < 0.8:
            log.insert(rng.randrange(len(log) + 1), {"k": step})
        elif r < 0.9 and log:
            i = rng.randrange(len(log))
            log[i] = {**log[i], "z": step}
        if rng.random() < 0.02:
            log = log[-rng.randrange(1, 300) :]
        new = {"log": log, "m": {"x": [*state["m"]["x"], step]} if r >= 0.9 else state["m"]}
        node = hashing.apply(node, delta.diff(state, new))
        assert node.hex == hashing.build(new).hex, step
        assert node.size == delta.json_size(new)
        state = new


def test_a_log_that_only_grew_is_noted_as_extending_the_previous_states_list():
    from agentrun.store import prefixes

    agent = get_agent("scripted")
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 3)
    s2 = run_steps(agent, s1, 4, 4)
    for name in ("history", "tool_calls", "decisions"):
        assert prefixes.starts_with(s2[name], s1[name]), name
        assert not prefixes.starts_with(s1[name], s2[name])
    # Noted lists that changed in length since are no longer vouched for.
    s1["decisions"].append({"step": 9, "thought": "late", "rationale": "", "action": "think"})
    assert not prefixes.starts_with(s2["decisions"], s1["decisions"])


class Rewriter:
    """observe hooks that change a log in place instead of appending to it."""

    @staticmethod
    def replace(st):
        st.history[1] = {"role": "user", "content": "rewritten"}

    @staticmethod
    def pop_and_append(st):
        last = st.decisions.pop()
        st.decisions.append({**last, "thought": "rewritten"})

    @staticmethod
    def delete(st):
        del st.tool_calls[0]

    @staticmethod
    def sort(st):
        st.history.sort(key=lambda m: m["role"])


@pytest.mark.parametrize(
    ("change", "log"),
    [
        ("replace", "history"),
        ("pop_and_append", "decisions"),
        ("delete", "tool_calls"),
        ("sort", "history"),
    ],
)
def test_a_log_changed_in_place_is_diffed_and_checked_in_full(change, log):
    from agentrun.agents import StateAgent
    from agentrun.store import prefixes

    class Rewriting(StateAgent):
        name = "rewriting-test"
        rewrite = False

        def observe(self, st, decision, results, ctx):
            if self.rewrite:
                getattr(Rewriter, change)(st)

    agent = Rewriting()
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 3)
    agent.rewrite = True
    s2 = run_steps(agent, s1, 4, 4)
    assert not prefixes.starts_with(s2[log], s1[log])
    ops = delta.diff(s1, s2)
    assert delta.canonical(delta.patch(s1, ops)) == delta.canonical(s2)
    node = hashing.apply(hashing.build(s1), ops)
    assert node.hex == hashing.build(s2).hex


def test_a_hook_that_puts_a_bad_item_in_place_is_refused():
    from agentrun.agents import StateAgent

    class Sneaky(StateAgent):
        name = "sneaky-test"
        sneak = False

        def observe(self, st, decision, results, ctx):
            if self.sneak:
                st.history[1] = {"role": "narrator", "content": "oops"}

    agent = Sneaky()
    s1 = run_steps(agent, agent.initial_state({"goal": "g"}), 1, 2)
    agent.sneak = True
    s2 = run_steps(agent, s1, 3, 3, check=False)
    with pytest.raises(StateError, match=r"history\[1\]\.role must be one of"):
        agent.validate_state(s2)


def test_a_long_typed_run_stores_exactly_its_states():
    from agentrun.store import snapshots

    agent = get_agent("scripted")
    state = agent.initial_state({"goal": "g"})
    agent.validate_state(state)
    prev, node = snapshots.build("r", 1, "pre", state, None, None)
    stored = json.loads(json.dumps(state))  # what a read of the chain rebuilds
    for k in range(1, 120):
        new = run_steps(agent, state, k, k)
        prev, node = snapshots.build("r", k, "post", new, prev, state, prev_node=node)
        data = json.loads(json.dumps(prev.data))
        stored = data if prev.kind == "full" else delta.patch(stored, data)
        assert delta.canonical(stored) == delta.canonical(new), k
        assert node.hex == hashing.build(new).hex == prev.hash, k
        state = new


def test_nodes_that_share_a_grown_list_each_keep_their_own_items():
    base = {"log": [{"i": i} for i in range(100)]}
    node = hashing.build(base)
    grown = {"log": [*base["log"], {"i": 100}]}
    other = {"log": [*base["log"], {"j": 1}, {"j": 2}]}
    shrunk = {"log": base["log"][:-1]}
    replaced = {"log": [{"k": 0}, *base["log"][1:]]}
    # Several successors of one node (a retried step, a fork): each appends to or
    # changes the shared list, and neither the base nor the others see it.
    for new in (grown, other, shrunk, replaced, grown):
        assert hashing.apply(node, delta.diff(base, new)).hex == hashing.build(new).hex
    assert node.hex == hashing.build(base).hex
    # A successor of a successor, then a sibling of it that replaces an item.
    n1 = hashing.apply(node, delta.diff(base, grown))
    n2 = hashing.apply(n1, delta.diff(grown, {"log": [*grown["log"], {"i": 101}]}))
    assert n2.hex == hashing.build({"log": [*grown["log"], {"i": 101}]}).hex
    edited = {"log": [*grown["log"][:50], {"e": 1}, *grown["log"][51:]]}
    assert hashing.apply(n1, delta.diff(grown, edited)).hex == hashing.build(edited).hex
    assert hashing.apply(n1, delta.diff(grown, other)).hex == hashing.build(other).hex
    assert n1.hex == hashing.build(grown).hex and node.hex == hashing.build(base).hex


def test_list_hashes_from_any_earlier_node_equal_hashes_built_from_scratch():
    rng = random.Random(12)
    pool = [({"log": [{"i": i} for i in range(80)]}, None)]
    pool[0] = (pool[0][0], hashing.build(pool[0][0]))
    for step in range(400):
        state, node = pool[rng.randrange(len(pool))] if rng.random() < 0.3 else pool[-1]
        log = list(state["log"])
        r = rng.random()
        if r < 0.6:
            log.extend({"a": step, "n": n} for n in range(rng.randrange(1, 3)))
        elif r < 0.7 and log:
            log.pop()
        elif r < 0.8 and log:
            log[rng.randrange(len(log))] = {"r": step}
        else:
            log.insert(rng.randrange(len(log) + 1), {"s": step})
        new = {"log": log}
        new_node = hashing.apply(node, delta.diff(state, new))
        assert new_node.hex == hashing.build(new).hex, step
        assert new_node.size == delta.json_size(new)
        pool.append((new, new_node))
