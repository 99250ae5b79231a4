"""storable.problem: one quick walk clears what is far within the limits; whatever it
can't clear gets shape_problem's and size_problem's answer, word for word."""

from __future__ import annotations

import datetime
import json
import random
from enum import StrEnum
from unittest import mock

import pytest

from agentrun.security import storable
from agentrun.security.redact import redact


class Colour(StrEnum):
    RED = "red"


def nest(depth: int, leaf: object = 1) -> object:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def random_value(rng: random.Random, depth: int = 0) -> object:
    roll = rng.random()
    if depth > 6 or roll < 0.45:
        return rng.choice(
            [
                "plain words",
                "naïve café ✓",
                "a NUL \x00 inside",
                "a lone \ud800 surrogate",
                "\u241b already escaped",
                "",
                0,
                -(10**15) + 1,
                10**15,
                10**20,
                1.5,
                float("nan"),
                float("inf"),
                True,
                None,
                "x" * rng.randint(0, 3000),
                Colour.RED,
                (1, 2),
                ({"deep": [[[[["tuple"]]]]]}, "\x00"),
                {1, 2},
                datetime.date(2026, 1, 1),
            ]
        )
    if roll < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["a", "b", "ключ", "with\x00nul", "sur\udc00rogate", 7, None, 1.5]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def slow(value, depth, max_bytes, text, what="$", named=None):
    found = storable.shape_problem(value, depth=depth, text=text, what=what)
    if found is None and max_bytes is not None:
        found = storable.size_problem(value, max_bytes, named or what)
    return found


@pytest.mark.parametrize("seed", range(40))
def test_the_quick_walk_answers_as_the_checks_it_stands_for(seed):
    rng = random.Random(seed)
    for _ in range(50):
        value = random_value(rng)
        depth = rng.choice([2, 4, 8, 30])
        max_bytes = rng.choice([None, 50, 2000, 10**6])
        text = rng.random() < 0.5
        assert storable.problem(
            value, depth=depth, max_bytes=max_bytes, text=text, what="w", named="the w"
        ) == slow(value, depth, max_bytes, text, "w", "the w")


@pytest.mark.parametrize("levels", [3, 4, 5])
def test_nesting_at_around_the_limit(levels):
    value = nest(levels)
    assert storable.problem(value, depth=4) == slow(value, 4, None, False)
    assert (storable.problem(value, depth=4) is None) == (levels <= 4)


def test_a_size_just_over_the_limit_is_measured_not_guessed():
    value = {"text": "é" * 100}
    exact = len(json.dumps(value, ensure_ascii=False).encode())
    assert storable.problem(value, max_bytes=exact) is None  # the bound said "look closer"
    assert "the limit is" in storable.problem(value, max_bytes=exact - 1)


def test_an_ordinary_result_is_cleared_by_the_quick_walk_alone(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("walked again")

    monkeypatch.setattr(storable, "shape_problem", refuse)
    monkeypatch.setattr(storable, "size_problem", refuse)
    result = {"rows": [{"id": i, "name": f"item {i}", "price": 9.5, "ok": None} for i in range(50)]}
    result["pair"] = ("a tuple", ["is", "a list"])
    assert storable.problem(result, max_bytes=1_000_000, text=True) is None


def _containers(value: object) -> list[object]:
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


@pytest.mark.parametrize("seed", range(20))
def test_escaping_and_redacting_in_one_walk_is_redacting_the_escaped_value(seed):
    rng = random.Random(seed)
    secrets = ["api_key", "password", "Authorization", "token"]
    for _ in range(50):
        value = random_value(rng)
        if rng.random() < 0.5:
            value = {
                rng.choice(secrets): rng.choice([None, "", True, "[REDACTED]", "hunter2", [1]]),
                "note": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz \x00",
                "inner": value,
            }
        out = storable.escape_redacted(value)
        assert [out] == [redact(storable.escape(value))]  # (in a list: NaN is itself there)
        # A copy: none of its lists and objects is one of the input's.
        mine = {id(c) for c in _containers(value)}
        assert not any(id(c) in mine for c in _containers(out))


@pytest.mark.parametrize("seed", range(10))
def test_a_decision_is_cleared_in_one_walk_only_when_its_two_checks_find_nothing(seed):
    # The decision's quick walk checks the whole at the args' own depth limit: args near
    # that limit are left to the two checks, which answer word for word.
    from agentrun.agents import Call, Decision
    from agentrun.engine import decide

    rng = random.Random(seed)
    limit = storable.max_depth()
    for _ in range(30):
        if rng.random() < 0.5:
            args = {"a": nest(rng.randint(limit - 5, limit + 1))}
        else:
            args = {"v": random_value(rng)}
        decision = Decision(thought="t", calls=[Call("echo", args)])
        quick = decide._shape_problem(decision)
        with mock.patch.object(storable, "clears", return_value=False):
            assert quick == decide._shape_problem(decision)
    deep = Decision(thought="t", calls=[Call("echo", {"a": nest(limit)})])
    assert "calls[0].args" in decide._shape_problem(deep)
    assert decide._shape_problem(Decision(calls=[Call("echo", {"a": nest(limit - 1)})])) is None
