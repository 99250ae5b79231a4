"""Tests for agentrun.state: phases, recording, snapshots, migration, token budgets."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun import state as state_module
from agentrun.state import (
    MIGRATIONS,
    SCHEMA_VERSION,
    TRANSITIONS,
    AgentState,
    IllegalTransition,
    MessageWindow,
    Phase,
    StateError,
    estimate_tokens,
    history_to_messages,
    message_tokens,
    truncate_history,
)

LEGAL = sorted(((src, dst) for src, dsts in TRANSITIONS.items() for dst in dsts), key=str)
ILLEGAL = sorted(
    ((src, dst) for src in Phase for dst in Phase if dst not in TRANSITIONS[src]), key=str
)


def state_in(phase: Phase) -> AgentState:
    return AgentState(phase=phase)


def tool_turn(call_id: str = "call_1", name: str = "search") -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": '{"q": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "result"},
    ]


# ---------------------------------------------------------------------------
# Phases and transitions
# ---------------------------------------------------------------------------


def test_phase_values_are_the_lower_case_names():
    assert [p.value for p in Phase] == [p.name.lower() for p in Phase]
    assert Phase("planning") is Phase.PLANNING
    assert Phase.PLANNING == "planning"
    assert str(Phase.PLANNING) == "planning"
    assert isinstance(Phase.DONE, str)


def test_a_new_state_starts_idle_with_empty_logs():
    s = AgentState()
    assert s.phase is Phase.IDLE
    assert s.schema_version == SCHEMA_VERSION == 1
    assert s.memory == {"goal": "", "plan": [], "completed": [], "notes": {}}
    assert s.history == s.tool_calls == s.decisions == s.failures == []
    assert (s.iteration, s.retries, s.final_answer, s.error) == (0, 0, None, None)


def test_the_transition_table_is_the_documented_one():
    expected = {
        Phase.IDLE: {Phase.PLANNING, Phase.ERROR},
        Phase.PLANNING: {
            Phase.EXECUTING,
            Phase.REFLECTING,
            Phase.WAITING,
            Phase.DONE,
            Phase.ERROR,
        },
        Phase.EXECUTING: {Phase.REFLECTING, Phase.WAITING, Phase.ERROR, Phase.DONE},
        Phase.REFLECTING: {Phase.PLANNING, Phase.DONE, Phase.ERROR},
        Phase.WAITING: {Phase.EXECUTING, Phase.PLANNING, Phase.ERROR},
        Phase.DONE: set(),
        Phase.ERROR: set(),
    }
    assert expected == TRANSITIONS


@pytest.mark.parametrize(("source", "target"), LEGAL)
def test_every_legal_transition_is_allowed(source, target):
    s = state_in(source)
    assert s.can(target)
    s.to(target)
    assert s.phase is target


@pytest.mark.parametrize(("source", "target"), ILLEGAL)
def test_every_illegal_transition_raises_naming_both_phases(source, target):
    s = state_in(source)
    assert not s.can(target)
    with pytest.raises(IllegalTransition) as caught:
        s.to(target)
    assert f"'{source.value}'" in str(caught.value)
    assert f"'{target.value}'" in str(caught.value)
    assert (caught.value.source, caught.value.target) == (source, target)
    assert s.phase is source


def test_illegal_transition_is_a_value_error():
    assert issubclass(IllegalTransition, ValueError)


@pytest.mark.parametrize("phase", [p for p in Phase if p not in (Phase.DONE, Phase.ERROR)])
def test_every_non_terminal_phase_can_fail(phase):
    s = state_in(phase)
    s.fail("boom")
    assert (s.phase, s.error) == (Phase.ERROR, "boom")


@pytest.mark.parametrize("phase", [Phase.DONE, Phase.ERROR])
def test_terminal_phases_allow_no_moves(phase):
    s = state_in(phase)
    assert s.is_terminal
    for target in Phase:
        with pytest.raises(IllegalTransition):
            s.to(target)


def test_to_accepts_phase_strings():
    s = AgentState()
    s.to("planning")
    assert s.phase is Phase.PLANNING


def test_convenience_methods_walk_a_full_run():
    s = AgentState()
    s.plan()
    s.execute()
    s.wait()
    s.execute()
    s.reflect()
    s.plan()
    s.finish("42")
    assert (s.phase, s.final_answer) == (Phase.DONE, "42")


def test_finish_from_idle_raises_and_leaves_the_answer_unset():
    s = AgentState()
    with pytest.raises(IllegalTransition):
        s.finish("too early")
    assert s.final_answer is None


def test_fail_after_done_raises_and_keeps_the_answer():
    s = state_in(Phase.PLANNING)
    s.finish("ok")
    with pytest.raises(IllegalTransition):
        s.fail("late")
    assert (s.phase, s.error) == (Phase.DONE, None)


# ---------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------


def test_add_message_appends_and_returns_the_message():
    s = AgentState()
    msg = s.add_message("user", "hi", ts=1)
    assert s.history == [{"role": "user", "content": "hi", "ts": 1}]
    assert s.history[0] is msg


def test_add_message_rejects_unknown_roles_with_the_path():
    s = AgentState()
    s.add_message("user", "hi")
    with pytest.raises(StateError, match=r"^history\[1\]\.role must be one of"):
        s.add_message("bot", "hi")
    assert len(s.history) == 1


def test_add_message_requires_a_tool_call_id_on_tool_messages():
    with pytest.raises(StateError, match=r"history\[0\]\.tool_call_id is required"):
        AgentState().add_message("tool", "result")


def test_assistant_messages_that_only_call_tools_may_have_null_content():
    s = AgentState()
    s.add_message(**{k: v for k, v in tool_turn()[0].items()})
    s.add_message("tool", "result", tool_call_id="call_1", name="search")
    with pytest.raises(StateError, match=r"history\[2\]\.content must be a string"):
        s.add_message("assistant", None)


def test_record_tool_call_numbers_calls_within_a_step():
    s = AgentState(iteration=3)
    first = s.record_tool_call("search", {"q": "a"})
    second = s.record_tool_call("fetch", {"url": "u"}, kind="http", status="error", attempts=2)
    s.iteration = 4
    third = s.record_tool_call("search", {"q": "b"}, result=["x"])
    assert (first["step"], first["index"]) == (3, 0)
    assert (second["step"], second["index"], second["kind"]) == (3, 1, "http")
    assert (third["step"], third["index"], third["result"]) == (4, 0, ["x"])
    assert set(first) == {"step", "index", "tool", "kind", "args", "status", "result", "attempts"}


def test_update_tool_call_replaces_the_record_instead_of_mutating_it():
    s = AgentState()
    old = s.record_tool_call("search", {"q": "a"}, status="pending")
    snapshot = s.to_dict()
    new = s.update_tool_call(0, status="ok", result="found")
    assert old["status"] == "pending"
    assert snapshot["tool_calls"][0] is old
    assert s.tool_calls[0] is new
    assert (new["status"], new["result"]) == ("ok", "found")


def test_record_decision_defaults_step_to_the_iteration():
    s = AgentState(iteration=2)
    d = s.record_decision("look it up", "no cached answer", {"tool": "search"})
    assert d == {
        "step": 2,
        "thought": "look it up",
        "rationale": "no cached answer",
        "action": {"tool": "search"},
    }


def test_record_failure_from_an_exception_keeps_type_message_and_traceback():
    s = AgentState(iteration=1)
    try:
        raise TimeoutError("tool took too long")
    except TimeoutError as exc:
        f = s.record_failure(exc, tool="search")
    assert (f["step"], f["type"], f["message"], f["tool"]) == (
        1,
        "TimeoutError",
        "tool took too long",
        "search",
    )
    assert "TimeoutError: tool took too long" in f["traceback"]


def test_record_failure_from_a_message_defaults_to_a_generic_type():
    f = AgentState().record_failure("bad output")
    assert (f["type"], f["message"], f["tool"], f["traceback"]) == (
        "Error",
        "bad output",
        None,
        None,
    )


def test_record_failure_accepts_a_failure_dict_and_keeps_extra_keys():
    failure = {
        "step": 5,
        "where": "decide",
        "type": "InvalidDecision",
        "message": "no tool named x",
        "tool": None,
        "traceback": "",
        "input": {"calls": []},
    }
    f = AgentState().record_failure(**failure)
    assert f == failure


def test_record_methods_reject_malformed_items():
    with pytest.raises(StateError, match=r"tool_calls\[0\]\.attempts must be >= 0"):
        AgentState().record_tool_call("x", attempts=-1)
    with pytest.raises(StateError, match=r"decisions\[0\]\.thought must be a string"):
        AgentState().record_decision(None)


# ---------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------


def busy_state() -> AgentState:
    s = AgentState(iteration=2, retries=1)
    s.memory["goal"] = "answer"
    s.memory["plan"] = ["search", "summarise"]
    s.memory["completed"] = ["search"]
    s.memory["notes"]["source"] = "wiki"
    s.add_message("system", "be brief")
    s.add_message("user", "question")
    for msg in tool_turn():
        s.add_message(**msg)
    s.record_tool_call("search", {"q": "x"}, result={"hits": 3})
    s.record_decision("summarise", "enough info", "finish")
    s.record_failure("flaky", tool="search")
    s.plan()
    return s


def test_to_dict_is_json_serialisable_with_the_phase_as_a_string():
    d = busy_state().to_dict()
    assert d["phase"] == "planning"
    assert json.loads(json.dumps(d)) == d


def test_to_dict_shares_items_but_not_containers():
    s = busy_state()
    d = s.to_dict()
    for name in ("history", "tool_calls", "decisions", "failures"):
        assert d[name] is not getattr(s, name)
        assert all(a is b for a, b in zip(d[name], getattr(s, name), strict=True))
    assert d["memory"] is not s.memory
    assert d["memory"]["plan"] is not s.memory["plan"]
    assert d["memory"]["notes"] is not s.memory["notes"]


def test_from_dict_shares_items_and_does_not_modify_its_input():
    d = busy_state().to_dict()
    before = json.dumps(d, sort_keys=True)
    s = AgentState.from_dict(d)
    assert json.dumps(d, sort_keys=True) == before
    assert s.history is not d["history"]
    assert all(a is b for a, b in zip(s.history, d["history"], strict=True))
    assert s.tool_calls[0] is d["tool_calls"][0]
    assert s.memory["notes"] is not d["memory"]["notes"]


def test_round_trip_preserves_a_busy_state():
    s = busy_state()
    assert AgentState.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_from_dict_fills_missing_fields_with_defaults():
    assert AgentState.from_dict({"schema_version": 1}) == AgentState()


text = st.text(max_size=30)
plain_messages = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["system", "user", "assistant"]),
    text,
)
tool_messages = st.builds(
    lambda call_id, content: {"role": "tool", "tool_call_id": call_id, "content": content},
    text,
    text,
)
assistant_calls = st.builds(
    lambda call_id, name, args: {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        ],
    },
    text,
    text,
    text,
)
histories = st.lists(st.one_of(plain_messages, tool_messages, assistant_calls), max_size=12)
notes = st.dictionaries(text, text, max_size=6)


@settings(max_examples=150)
@given(
    history=histories,
    notes=notes,
    plan=st.lists(text, max_size=4),
    phase=st.sampled_from(Phase),
    counters=st.tuples(st.integers(0, 10**6), st.integers(0, 100)),
    answer=st.none() | text,
)
def test_round_trip_through_json_preserves_any_valid_state(
    history, notes, plan, phase, counters, answer
):
    s = AgentState(
        phase=phase,
        history=history,
        memory={"goal": "g", "plan": plan, "completed": plan[:1], "notes": notes},
        iteration=counters[0],
        retries=counters[1],
        final_answer=answer,
    )
    restored = AgentState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert restored == s
    assert restored.to_dict() == s.to_dict()


def valid_snapshot() -> dict:
    return json.loads(json.dumps(busy_state().to_dict()))


def set_path(d: dict, path: list, value) -> dict:
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return d


def drop_path(d: dict, path: list) -> dict:
    target = d
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return d


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["phase"], "x", "phase: unknown phase 'x'"),
        (["phase"], 3, "phase must be a string, got integer"),
        (["memory", "notes"], [], "memory.notes must be an object, got array"),
        (["memory", "notes", "source"], 1, "memory.notes.source must be a string, got integer"),
        (["memory", "notes", "a key"], None, "memory.notes['a key'] must be a string, got null"),
        (["memory", "plan", 1], {}, "memory.plan[1] must be a string, got object"),
        (["memory", "goal"], None, "memory.goal must be a string, got null"),
        (["memory", "todo"], [], "memory.todo is not a memory field"),
        (["memory"], "x", "memory must be an object, got string"),
        (["history"], {}, "history must be an array, got object"),
        (["history", 3], "hi", "history[3] must be an object, got string"),
        (["history", 3, "role"], "bot", "history[3].role must be one of 'system', 'user'"),
        (["history", 1, "content"], None, "history[1].content must be a string, got null"),
        (["history", 2, "tool_calls"], {}, "history[2].tool_calls must be an array"),
        (["history", 2, "tool_calls", 0, "id"], 7, "history[2].tool_calls[0].id must be a string"),
        (["history", 1, "tool_calls"], [], "history[1].tool_calls is only allowed on assistant"),
        (["tool_calls", 0, "args"], "q=x", "tool_calls[0].args must be an object, got string"),
        (["tool_calls", 0, "attempts"], True, "tool_calls[0].attempts must be an integer"),
        (["tool_calls", 0, "step"], -1, "tool_calls[0].step must be >= 0, got -1"),
        (["decisions", 0, "rationale"], 5, "decisions[0].rationale must be a string or null"),
        (["failures", 0, "traceback"], [], "failures[0].traceback must be a string or null"),
        (["iteration"], "2", "iteration must be an integer, got string"),
        (["retries"], -1, "retries must be >= 0, got -1"),
        (["final_answer"], 42, "final_answer must be a string or null, got integer"),
        (["schema_version"], 99, "schema_version is 99, this code reads versions 0 to 1"),
        (["schema_version"], "1", "schema_version must be an integer, got string"),
        (["colour"], "red", "colour is not a state field"),
    ],
)
def test_invalid_snapshots_raise_state_errors_naming_the_path(path, value, message):
    d = set_path(valid_snapshot(), path, value)
    with pytest.raises(StateError) as caught:
        AgentState.from_dict(d)
    assert message in str(caught.value)
    assert str(caught.value).startswith(caught.value.path)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (["history", 3, "tool_call_id"], "history[3].tool_call_id is required"),
        (["history", 0, "role"], "history[0].role is required"),
        (["tool_calls", 0, "tool"], "tool_calls[0].tool is required"),
        (["failures", 0, "message"], "failures[0].message is required"),
    ],
)
def test_missing_required_item_keys_are_reported_by_path(path, message):
    with pytest.raises(StateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        AgentState.from_dict(drop_path(valid_snapshot(), path))


def test_a_snapshot_that_is_not_an_object_is_rejected():
    with pytest.raises(StateError, match="state must be an object, got array"):
        AgentState.from_dict([])


def test_optional_item_keys_may_be_absent_and_extra_keys_are_kept():
    d = valid_snapshot()
    del d["tool_calls"][0]["result"]
    del d["failures"][0]["traceback"]
    d["history"][0]["ts"] = 12.5
    s = AgentState.from_dict(d)
    assert s.history[0]["ts"] == 12.5


# ---------------------------------------------------------------------------
# Migrations
# ---------------------------------------------------------------------------


def v0_snapshot() -> dict:
    return {
        "phase": "executing",
        "messages": [{"role": "user", "content": "hi"}],
        "memory": {"goal": "greet"},
        "iteration": 1,
    }


def test_a_v0_snapshot_without_schema_version_migrates_messages_to_history():
    old = v0_snapshot()
    s = AgentState.from_dict(old)
    assert s.schema_version == SCHEMA_VERSION
    assert s.phase is Phase.EXECUTING
    assert s.history == [{"role": "user", "content": "hi"}]
    assert s.history[0] is old["messages"][0]
    assert s.memory == {"goal": "greet", "plan": [], "completed": [], "notes": {}}
    assert "messages" in old and "history" not in old
    assert AgentState.from_dict(s.to_dict()) == s


def test_a_v0_snapshot_with_both_messages_and_history_is_rejected():
    with pytest.raises(StateError, match="^messages: .*both"):
        AgentState.from_dict({**v0_snapshot(), "history": []})


def test_migrated_v0_snapshots_are_validated_with_v1_paths():
    old = v0_snapshot()
    old["messages"][0]["role"] = "bot"
    with pytest.raises(StateError, match=r"^history\[0\]\.role"):
        AgentState.from_dict(old)


def test_migrations_chain_up_to_the_current_version(monkeypatch):
    monkeypatch.setattr(state_module, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(MIGRATIONS, 1, lambda d: {**d, "retries": d.get("retries", 0) + 7})
    s = AgentState.from_dict(v0_snapshot())
    assert (s.schema_version, s.retries, len(s.history)) == (2, 7, 1)


def test_a_missing_migration_is_reported(monkeypatch):
    monkeypatch.setattr(state_module, "SCHEMA_VERSION", 2)
    with pytest.raises(StateError, match="schema_version is 1 and no migration from it exists"):
        AgentState.from_dict({"schema_version": 1})


# ---------------------------------------------------------------------------
# Chat messages
# ---------------------------------------------------------------------------


def test_history_to_messages_drops_internal_keys():
    s = AgentState()
    s.add_message("user", "hi", ts=1, step=0)
    s.add_message(**tool_turn()[0], latency_ms=30)
    s.add_message("tool", "result", tool_call_id="call_1", name="search", raw={"x": 1})
    assert history_to_messages(s) == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "x"}'},
                }
            ],
        },
        {"role": "tool", "content": "result", "tool_call_id": "call_1"},
    ]
    assert s.history[0]["ts"] == 1


def test_history_to_messages_normalises_hand_edited_tool_calls():
    history = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    messages = history_to_messages(history)
    assert messages[0]["tool_calls"] == [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]
    assert messages[1] == {"role": "assistant", "content": ""}


# ---------------------------------------------------------------------------
# Tokens and truncation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 0), (None, 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 400, 100)]
)
def test_estimate_tokens_is_a_quarter_of_the_length_rounded_up(text, tokens):
    assert estimate_tokens(text) == tokens


def test_message_tokens_count_tool_call_arguments():
    plain = {"role": "assistant", "content": None}
    calling = tool_turn()[0]
    assert message_tokens(calling) > message_tokens(plain)


def cost(messages) -> int:
    return sum(message_tokens(m) for m in messages)


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "rules " * 10},
        {"role": "user", "content": "first question " * 5},
        {"role": "assistant", "content": "first answer " * 5},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": "second question"},
        *tool_turn("c1"),
        {"role": "assistant", "content": "second answer"},
    ]


def test_truncation_keeps_everything_when_it_fits():
    msgs = conversation()
    out = truncate_history(msgs, cost(msgs))
    assert out == msgs
    assert out is not msgs
    assert all(a is b for a, b in zip(out, msgs, strict=True))


def test_truncation_keeps_system_messages_and_the_most_recent_turns():
    msgs = conversation()
    budget = cost([msgs[0], msgs[3], *msgs[4:]])
    assert truncate_history(msgs, budget) == [msgs[0], msgs[3], *msgs[4:]]


def test_truncation_drops_a_tool_call_together_with_its_results():
    msgs = conversation()
    budget = cost([msgs[0], msgs[3], msgs[-1]]) + cost(msgs[5:7]) - 1
    out = truncate_history(msgs, budget)
    assert out == [msgs[0], msgs[3], msgs[-1]]


def test_truncation_stops_at_the_first_turn_that_does_not_fit():
    msgs = [
        {"role": "user", "content": "old and short"},
        {"role": "assistant", "content": "x" * 4000},
        {"role": "user", "content": "latest"},
    ]
    assert truncate_history(msgs, cost([msgs[0], msgs[2]])) == [msgs[2]]


def test_when_system_messages_exceed_the_budget_the_last_message_is_still_kept():
    msgs = conversation()
    assert truncate_history(msgs, 1) == [msgs[0], msgs[3], msgs[-1]]


def test_when_the_last_turn_is_a_tool_call_it_is_kept_whole_even_over_budget():
    msgs = conversation()[:7]
    assert truncate_history(msgs, 0) == [msgs[0], msgs[3], msgs[5], msgs[6]]


def test_truncating_an_empty_history_gives_an_empty_list():
    assert truncate_history([], 100) == []


def turns():
    plain = st.builds(
        lambda role, n: {"role": role, "content": "w" * n},
        st.sampled_from(["system", "user", "assistant"]),
        st.integers(0, 80),
    )
    calls = st.integers(1, 3).map(
        lambda n: [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{i}", "function": {"name": "t", "arguments": "{}"}} for i in range(n)
                ],
            },
            *({"role": "tool", "tool_call_id": f"c{i}", "content": "r" * 9} for i in range(n)),
        ]
    )
    return st.lists(plain.map(lambda m: [m]) | calls, max_size=10).map(
        lambda groups: [m for g in groups for m in g]
    )


@settings(max_examples=200)
@given(messages=turns(), budget=st.integers(0, 300))
def test_truncation_never_orphans_tool_messages_and_keeps_order(messages, budget):
    out = truncate_history(messages, budget)
    positions = [next(i for i, m in enumerate(messages) if m is o) for o in out]
    assert positions == sorted(positions)
    assert [m for m in messages if m["role"] == "system"] == [
        m for m in out if m["role"] == "system"
    ]
    for k, m in enumerate(out):
        if m["role"] == "tool":
            prev = out[k - 1]
            assert k > 0 and (prev["role"] == "tool" or prev.get("tool_calls"))
        if m.get("tool_calls"):
            expected = len(m["tool_calls"])
            assert [x["role"] for x in out[k + 1 : k + 1 + expected]] == ["tool"] * expected
    others = [m for m in messages if m["role"] != "system"]
    kept = [m for m in out if m["role"] != "system"]
    if others:
        assert kept and kept[-1] is others[-1]
        # The kept turns are a contiguous run ending at the latest one.
        assert all(a is b for a, b in zip(kept, others[len(others) - len(kept) :], strict=True))
    if others and cost(out) > budget:
        # Over budget only when nothing but the system messages and the
        # latest turn (an assistant tool call with its results) is left.
        last_turn_start = len(others) - 1
        while others[last_turn_start]["role"] == "tool" and last_turn_start > 0:
            last_turn_start -= 1
        assert len(kept) <= len(others) - last_turn_start


def window_turns():
    """Conversations as turns() makes them, with a tool message answering no call now
    and then, and an assistant message with an empty list of tool calls."""
    odd = st.sampled_from(
        [
            [{"role": "tool", "tool_call_id": "x", "content": "orphan"}],
            [{"role": "assistant", "content": None, "tool_calls": []}],
        ]
    )
    return st.lists(turns() | odd, max_size=4).map(lambda parts: [m for p in parts for m in p])


@settings(max_examples=300)
@given(
    messages=window_turns(),
    cuts=st.lists(st.integers(0, 40), max_size=3),
    budgets=st.lists(st.integers(0, 400), min_size=1, max_size=3),
)
def test_a_growing_message_window_keeps_what_truncate_history_keeps(messages, cuts, budgets):
    window = MessageWindow()
    done = 0
    for cut in [*sorted(cuts), len(messages)]:
        cut = min(cut, len(messages))
        window.extend(messages[done:cut])
        done = max(done, cut)
        converted = history_to_messages(messages[:done])
        assert window.messages == converted and len(window) == done
        assert window.texts == [json.dumps(m).encode() for m in converted]
        for budget in budgets:
            system, start, tokens = window.fit(budget)
            expected = truncate_history(converted, budget)
            where = {id(m): i for i, m in enumerate(converted)}
            assert [*system, *range(start, done)] == [where[id(m)] for m in expected]
            assert tokens == cost(expected)


# The fast validators in from_dict may only accept items the detailed,
# path-reporting validators accept too.
scalars = st.none() | st.booleans() | st.integers(-2, 3) | st.sampled_from(["", "x", "tool"])
loose_calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": scalars,
            "function": st.fixed_dictionaries({}, optional={"name": scalars}) | scalars,
        },
    )
    | scalars,
    max_size=2,
)
loose_messages = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool", "bot"]) | scalars,
        "content": scalars,
        "tool_calls": loose_calls | scalars,
        "tool_call_id": scalars,
        "name": scalars,
    },
)
loose_records = st.dictionaries(
    st.sampled_from(
        ["step", "index", "tool", "kind", "args", "status", "result", "attempts", "thought"]
        + ["rationale", "action", "type", "message", "traceback"]
    ),
    scalars | st.dictionaries(st.just("k"), scalars, max_size=1),
    max_size=14,
)


@settings(max_examples=300)
@given(item=loose_messages | loose_records | scalars)
def test_fast_item_checks_never_accept_what_the_detailed_checks_reject(item):
    for fast, detailed in state_module._ITEM_CHECKS.values():
        if fast(item):
            detailed(item, "item")
