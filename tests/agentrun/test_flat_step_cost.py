"""A StateAgent step costs what it changes, not the size of the run's state (f-watch).

The typed state a step's update made is taken over by the next step (no rebuild from the
dict, no walk over the whole history); validate_state checks only what a step added; a
long list's hash is extended by the appended items. None of it may change a result: the
same states, the same hashes, the same refusals.
"""

from __future__ import annotations

import random

import pytest

from agentrun import delta, hashing
from agentrun.agents import _TYPED, CallResult, Decision, StepContext, get_agent
from agentrun.state import AgentState, StateError, validate_successor


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
