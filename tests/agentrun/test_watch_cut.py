"""A dense watch parses only the ops of a delta up to the last one that can reach the
watched path (watch.ops_reaching): it must hand back exactly the ops a whole parse
would, whatever the values around them hold."""

from __future__ import annotations

import json
import random

import pytest

from agentrun.models import Snapshot
from agentrun.store import watch
from agentrun.store.codec import json_text
from agentrun.store.watch import parse_path
from tests.agentrun.test_watch import chain, rebuilt_changes

# Values that look like ops on the watched key, or hold its name, or a whole-state op.
DECOYS = [
    ["set", ["log"], 1],
    [["splice", ["log"], 0, 0, [{"n": 999}]], ["set", ["log", 0, "n"], 5]],
    {"note": '"log"', "ops": [1, ["del", ["log", 0]]]},
    '["set",[],{"log":[]}]',
    ["set", [], {"log": [7]}],
    'a "log" in a sentence',
    {"log": {"log": ["log"]}},
]


def whole(text: bytes, path: tuple) -> list:
    return [op for op in json.loads(text) if watch._reaches(op[1], path)]


def random_ops(rng: random.Random, keys: list[str], root: bool) -> list:
    ops: list = []
    for _ in range(rng.randint(1, 7)):
        key = rng.choice(keys)
        value = rng.choice([*DECOYS, rng.random(), "x" * rng.randint(0, 2000)])
        kind = rng.random()
        if kind < 0.4:
            ops.append(["set", [key, *([rng.randint(0, 3)] if rng.random() < 0.3 else [])], value])
        elif kind < 0.6:
            ops.append(["splice", [key], rng.randint(0, 5), rng.randint(0, 2), [value]])
        elif kind < 0.7:
            ops.append(["del", [key, "k"]])
        else:
            ops.append(["set", [key, "inner", "n"], value])
    if root:
        ops.insert(rng.randrange(len(ops) + 1), ["set", [], {"log": [1], "other": DECOYS}])
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_the_ops_that_reach_a_path_are_those_a_whole_parse_finds(seed):
    rng = random.Random(seed)
    keys = ["log", "other", "logs", "lo", 'a"b', "café", "a\\b", "big"]
    paths = [
        parse_path(p)
        for p in ("log[-1].n", "log[0]", "other.inner.n", "logs", '/a"b', "/café", "/a\\b/x")
    ]
    for _ in range(300):
        root = rng.random() < 0.2
        ops = random_ops(rng, keys, root)
        text = json_text(ops).encode()
        for path in paths:
            reaching = watch.ops_reaching(path)
            assert reaching(text) == whole(text, path), (path, ops)
            if not root:  # the index says there is no op on the whole state
                assert reaching(text, False) == whole(text, path), (path, ops)


def test_the_ops_after_the_last_mention_of_the_key_are_not_parsed():
    """The text after the last "log" is not valid JSON: a whole parse would fail."""
    head = json_text([["splice", ["log"], 3, 0, [{"n": 3}]], ["set", ["other"], 1]])
    text = (head[:-1] + ',["set",["big"],{not json}]]').encode()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    reaching = watch.ops_reaching(parse_path("log[-1].n"))
    assert reaching(text, False) == [["splice", ["log"], 3, 0, [{"n": 3}]]]


@pytest.mark.django_db
@pytest.mark.parametrize("pad", [True, False], ids=["deltas", "with-keyframes"])
def test_a_dense_history_beside_values_that_look_like_ops_on_its_path(monkeypatch, pad):
    """log[-1].n changes at every step, read from the chain in one pass; the other keys
    hold op-like lists and texts that name "log", before and after it in the deltas."""
    rng = random.Random(3)
    states = [{"a": 0, "log": [{"n": 0}], "z": 0}]
    for step in range(1, 90):
        prev = states[-1]
        log = [*prev["log"], {"n": step}] if rng.random() < 0.8 else prev["log"]
        states.append({"a": rng.choice(DECOYS), "log": log, "z": [step, rng.choice(DECOYS)]})
    run = chain(*states, pad=pad)
    if not pad:
        assert Snapshot.objects.filter(run=run, kind="full").count() > 3
    cut = []
    real = watch.ops_reaching

    def spy(path):
        reaching = real(path)
        return lambda text, root=True: cut.append(text) or reaching(text, root)

    monkeypatch.setattr(watch, "ops_reaching", spy)
    for text in ("log[-1].n", "log[-1]", "log[2].n", "z[1]", "a"):
        path = parse_path(text)
        got = watch.history(run, path)
        assert [(c.step, c.before, c.after) for c in got.changes] == rebuilt_changes(run, path)
    assert len(cut) > 80, "the deltas were not read through the chain"


@pytest.mark.parametrize("seed", range(3))
def test_a_keyframe_read_for_a_watch_holds_the_watched_key_whole_and_nothing_else(seed):
    rng = random.Random(seed)
    for _ in range(200):
        keys = rng.sample(["log", "other", 'a"b', "café", "z", "logs"], rng.randint(0, 6))
        state = {k: rng.choice([*DECOYS, {"log": DECOYS}, None, 0]) for k in keys}
        text = json_text(state).encode()
        for key in ("log", 'a"b', "café", "missing"):
            held = watch.state_along((key, 0))(text)
            assert held == ({key: state[key]} if key in state else {}), (key, state)
        assert watch.state_along(())(text) == state


def test_a_keyframe_that_is_not_an_object_is_read_whole():
    for value in ([1, 2], "text", 3, None):
        assert watch.state_along(("log",))(json_text(value).encode()) == value
