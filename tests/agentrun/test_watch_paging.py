"""A paged history reads the run only as far as its page, and still knows the value now."""

from __future__ import annotations

import json
import random

import pytest

from agentrun.models import Snapshot
from agentrun.store import watch
from agentrun.store.delta import canonical
from agentrun.store.watch import MISSING, parse_path
from tests.agentrun.test_watch import chain

pytestmark = pytest.mark.django_db


def key(value):
    return repr(value) if value is MISSING else canonical(value)


def test_a_history_stops_one_change_after_its_limit_and_says_there_are_more():
    run = chain(*({"n": k, "other": {"x": k % 3}} for k in range(40)))
    whole = watch.history(run, parse_path("n"))
    assert len(whole.changes) == 39 and not whole.more

    page = watch.history(run, parse_path("n"), limit=5)

    assert [c.step for c in page.changes] == [1, 2, 3, 4, 5]
    assert page.changes == whole.changes[:5]
    assert page.more and page.ever_existed and page.exists_now
    assert page.current == 39 == whole.current
    assert page.snapshots_read < 15 < whole.snapshots_read
    # Exactly as many changes as the limit: nothing more to say.
    exact = watch.history(run, parse_path("n"), limit=39)
    assert not exact.more and exact.changes == whole.changes
    assert not watch.history(run, parse_path("n"), limit=500).more


def test_a_limited_history_of_a_value_that_never_existed_is_complete():
    run = chain(*({"n": k} for k in range(10)))
    h = watch.history(run, parse_path("memory.nowhere"), limit=3)
    assert (h.changes, h.more, h.ever_existed, h.exists_now) == ([], False, False, False)


def random_states(seed: int, steps: int) -> list[dict]:
    rng = random.Random(seed)
    states = [{"a": [{"k": 0, "v": [0]}], "b": {"c": {"d": 0}}, "n": 0}]
    for step in range(1, steps):
        s = json.loads(json.dumps(states[-1]))
        s["n"] = step
        r = rng.random()
        if r < 0.2:
            s["a"].append({"k": step, "v": [step]})
        elif r < 0.3 and s["a"]:
            s["a"].pop(rng.randrange(len(s["a"])))
        elif r < 0.4 and s["a"]:
            s["a"].insert(rng.randrange(len(s["a"]) + 1), {"k": -step, "v": []})
        elif r < 0.55 and s["a"]:
            s["a"][rng.randrange(len(s["a"]))]["v"].append(step)
        elif r < 0.65 and s["a"]:
            s["a"][rng.randrange(len(s["a"]))] = {"k": step * 10, "v": [step]}
        elif r < 0.75:
            s["b"].setdefault("c", {})["d"] = step
        elif r < 0.8:
            s["b"] = {"c": {"d": step}} if rng.random() < 0.5 else {}
        elif r < 0.85:
            s["b"].setdefault("c", {})["e"] = [step]
        elif r < 0.9:
            s["a"] = s["a"][-3:]
        states.append(s)
    return states


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_value_now_read_backwards_agrees_with_the_whole_history(seed):
    run = chain(*random_states(seed, 80))
    for text in ("n", "a[0]", "a[1].v", "a[2].k", "a[-1].v", "b.c.d", "b.c", "b", "a[7]", "z"):
        path = parse_path(text)
        whole = watch.history(run, path)
        assert key(watch.value_now(run, path)) == key(whole.current), text
        for upto in (5, 33, 60):
            seq = Snapshot.seq_for(upto, "post")
            part = watch.history(run, path, (upto, "post"))
            assert key(watch.value_now(run, path, seq)) == key(part.current), (text, upto)


def test_the_value_now_is_read_through_keyframes_too():
    big = "x" * 5000
    states = [{"n": k, "big": big + "y" * k, "list": list(range(k % 4))} for k in range(12)]
    run = chain(*states)
    assert Snapshot.objects.filter(run=run, kind="full", seq__gt=2).exists()
    for text in ("n", "big", "list[-1]", "list[1]"):
        path = parse_path(text)
        assert key(watch.value_now(run, path)) == key(watch.history(run, path).current), text
        limited = watch.history(run, path, limit=1)
        assert key(limited.current) == key(watch.resolve(states[-1] | {"pad": ""}, path)), text


def test_a_limited_history_around_a_step_goes_on_to_the_first_change_after_it():
    run = chain(*({"n": k} for k in range(40)))
    h = watch.history(run, parse_path("n"), limit=2, past_step=10)
    assert [c.step for c in h.changes] == list(range(1, 12))
    assert h.more and h.current == 39
    before, at, after = h.around(10)
    assert (before.step, at.step, after.step) == (9, 10, 11)
    # A step after the last change: the whole history, nothing more.
    h = watch.history(run, parse_path("n"), limit=2, past_step=50)
    assert len(h.changes) == 39 and not h.more
