"""Watching one value of a run's state: the steps that changed it, found from the deltas."""

from __future__ import annotations

import json

import pytest

from agentrun.builtin.shop import STAGE_STEPS
from agentrun.lifecycle import services
from agentrun.models import Run, Snapshot
from agentrun.store import codec, snapshots, watch
from agentrun.store.watch import MISSING, PathSyntaxError, parse_path
from tests.base import calls, drive, final, make_people, make_run, play_incident, script

pytestmark = pytest.mark.django_db

RECOMMEND = STAGE_STEPS["recommend"]  # 3


@pytest.fixture
def incident():
    return play_incident()


def skus(note: str) -> list[str]:
    return [line["sku"] for line in json.loads(note)]


def corrected_fork(incident: Run) -> Run:
    state = snapshots.load(incident.pk, RECOMMEND, "pre")
    notes = dict(state["memory"]["notes"])
    notes["cart"] = json.dumps([x for x in json.loads(notes["cart"]) if x["sku"] != "STOVE-1"])
    state = {**state, "memory": {**state["memory"], "notes": notes}}
    fork = services.fork_run(
        incident,
        step=RECOMMEND,
        at="pre",
        state=state,
        reason="the cart changed",
        user=make_people()["operator"],
    )
    return drive(fork, through_backoff=True)


PAD = "p" * 4000


def chain(*states: dict, pad: bool = True) -> Run:
    """A run whose snapshots are these states: pre of step 1, then the post of each step."""
    run = Run.objects.create(agent="scripted", input={}, status="succeeded")
    prev = prev_state = None
    for i, state in enumerate(states):
        if pad:
            state = {**state, "pad": PAD}  # deltas small beside the state: no keyframes
        step, at = (1, "pre") if i == 0 else (i, "post")
        snap, _ = snapshots.build(run.pk, step, at, state, prev, prev_state)
        snap.save()
        prev, prev_state = snap, state
    return run


def rebuilt_changes(run: Run, path: tuple) -> list[tuple]:
    """(step, before, after) wherever the value at path differs from the state before, from
    every state rebuilt in full: what a history must say."""
    full = [st for snap, st in snapshots.history(run.pk) if snap.at == "post" or snap.step == 1]
    values = [watch.resolve(st, path) for st in full]
    return [
        (i, values[i - 1], values[i])
        for i in range(1, len(values))
        if not watch.same(values[i - 1], values[i])
    ]


def changes(run: Run, path: str) -> list[tuple]:
    return [
        (c.step, c.at, c.kind, c.before, c.after)
        for c in watch.history(run, parse_path(path)).changes
    ]


# --- the incident ---------------------------------------------------------------------


def test_the_stale_cart_note_was_written_once_at_step_2_and_never_again(incident):
    h = watch.history(incident, parse_path("memory.notes.cart"))

    assert [(c.step, c.at, c.kind, c.inherited) for c in h.changes] == [(2, "post", "added", False)]
    (change,) = h.changes
    assert change.before is MISSING and change.how == "set"
    assert skus(change.after) == ["STOVE-1", "TENT-2P"]
    assert not h.start.exists and h.ever_existed and h.exists_now
    # The user removed the stove after step 2; the note still has it at the end.
    assert skus(h.current) == ["STOVE-1", "TENT-2P"]
    assert skus(snapshots.load(incident.pk, 10, "post")["memory"]["notes"]["cart"]) == [
        "STOVE-1",
        "TENT-2P",
    ]


def test_only_the_snapshots_that_may_have_touched_the_path_are_read(incident):
    h = watch.history(incident, parse_path("/memory/notes/cart"))
    stored = Snapshot.objects.filter(run=incident).exclude(kind="ref").count()
    # The first snapshot, and the ones touching memory.notes.cart itself (or all of memory).
    assert h.snapshots_read < stored / 2, (h.snapshots_read, stored)


def test_snapshots_stored_before_the_index_existed_are_all_read_and_give_the_same_answer(
    incident,
):
    indexed = changes(incident, "memory.notes.cart")
    Snapshot.objects.filter(run=incident).update(paths="")

    h = watch.history(incident, parse_path("memory.notes.cart"))

    assert [(c.step, c.at, c.kind, c.before, c.after) for c in h.changes] == indexed
    assert h.snapshots_read == Snapshot.objects.filter(run=incident).exclude(kind="ref").count()


def test_a_parent_value_changed_inside_lists_every_step_that_changed_a_note(incident):
    h = watch.history(incident, parse_path("memory.notes"))
    notes_changed = [c.step for c in h.changes]
    assert notes_changed[:3] == [1, 2, 3]
    assert all(c.kind == "set" and c.how.startswith("changed inside") for c in h.changes[1:])
    assert "memory.notes.cart" in h.changes[1].how


# --- forks ----------------------------------------------------------------------------


def test_a_fork_inherits_its_parents_history_before_the_fork_point(incident):
    fixed = corrected_fork(incident)

    h = watch.history(fixed, parse_path("memory.notes.cart"))

    assert [(c.step, c.at, c.inherited, str(c.run_id)) for c in h.changes] == [
        (2, "post", True, str(incident.pk)),
        (RECOMMEND, "pre", False, str(fixed.pk)),
    ]
    inherited, edit = h.changes
    assert skus(inherited.after) == ["STOVE-1", "TENT-2P"]
    assert (skus(edit.before), skus(edit.after)) == (["STOVE-1", "TENT-2P"], ["TENT-2P"])
    assert edit.how.startswith("edited before the step")
    assert skus(h.current) == ["TENT-2P"]
    assert str(h.start.run_id) == str(incident.pk)
    # The parent's own history is unchanged by its fork.
    assert [c.step for c in watch.history(incident, parse_path("memory.notes.cart")).changes] == [2]


def test_an_unedited_fork_shows_the_parents_change_as_inherited_only(incident):
    fork = drive(services.fork_run(incident, step=5, at="post", mode="sandbox"))
    h = watch.history(fork, parse_path("memory.notes.cart"))
    assert [(c.step, c.inherited) for c in h.changes] == [(2, True)]


# --- paths into lists, ancestors, absent paths --------------------------------------------


def test_a_list_item_is_followed_by_index_as_the_list_grows():
    run = drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"x": 1}}),
                calls({"tool": "echo", "args": {"x": 2}}),
                final("ok"),
            )
        )
    )
    # history: [user goal, assistant, tool result of step 1, ...]
    assert changes(run, "history[2].content") == [(1, "post", "added", MISSING, '{"x": 1}')]
    assert changes(run, "/history/2/content") == changes(run, "history.2.content")
    assert changes(run, "tool_calls[1].result") == [(2, "post", "added", MISSING, {"x": 2})]
    # The last message is another one after every step.
    last = changes(run, "history[-1].content")
    assert [(step, before, after) for step, _, _, before, after in last] == [
        (1, "test goal", '{"x": 1}'),
        (2, '{"x": 1}', '{"x": 2}'),
        (3, '{"x": 2}', "ok"),
    ]


def test_a_splice_that_shifts_a_list_moves_a_new_value_under_the_index():
    run = chain(
        {"items": [{"v": "a"}, {"v": "b"}]},
        {"items": [{"v": "a"}, {"v": "b"}, {"v": "c"}]},  # appended: items[1] unchanged
        {"items": [{"v": "b"}, {"v": "c"}]},  # the first dropped: items[1] is now c
        {"items": [{"v": "b"}, {"v": "c2"}]},  # c changed in place
    )
    assert changes(run, "items[1].v") == [
        (2, "post", "moved", "b", "c"),
        (3, "post", "set", "c", "c2"),
    ]
    assert changes(run, "items[2].v") == [
        (1, "post", "added", MISSING, "c"),
        (2, "post", "removed", "c", MISSING),
    ]


def test_replacing_or_deleting_an_ancestor_changes_the_value_under_it():
    run = chain(
        {"memory": {"notes": {"cart": "A"}, "plan": []}},
        {"memory": {"notes": {"cart": "A", "x": "1"}, "plan": []}},  # a sibling: no change
        {"memory": {"other": 1}},  # memory replaced, cart gone
        {"memory": {"notes": {"cart": "B"}}},
        {},
    )
    h = watch.history(run, parse_path("memory.notes.cart"))
    assert [(c.step, c.kind, c.before, c.after) for c in h.changes] == [
        (2, "removed", "A", MISSING),
        (3, "added", MISSING, "B"),
        (4, "removed", "B", MISSING),
    ]
    assert h.start.value == "A" and not h.exists_now
    assert "replaced" in h.changes[0].how or "deleted" in h.changes[0].how


def test_a_number_in_a_path_is_also_an_all_digit_key_of_an_object():
    run = chain({"by_id": {"7": "x"}}, {"by_id": {"7": "y"}})
    assert changes(run, "by_id.7") == [(1, "post", "set", "x", "y")]
    assert changes(run, "/by_id/7") == changes(run, 'by_id["7"]')


def test_keyframes_are_read_for_the_change_they_stand_for(monkeypatch):
    # A keyframe as soon as the deltas outweigh the state, rewritten or not.
    monkeypatch.setattr(snapshots, "KEYFRAME_ROWS", 0)
    big = "x" * 5000
    run = chain({"n": 0, "big": big}, {"n": 1, "big": big + "y"}, {"n": 2, "big": big + "yz"})
    kinds = list(Snapshot.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert "full" in kinds[1:], kinds  # the rewritten string outweighs the state: keyframes
    assert changes(run, "n") == [(1, "post", "set", 0, 1), (2, "post", "set", 1, 2)]


def test_a_path_that_never_existed_says_so(incident):
    h = watch.history(incident, parse_path("memory.notes.basket"))
    assert (h.changes, h.ever_existed, h.exists_now, h.start.exists) == ([], False, False, False)
    h = watch.history(incident, parse_path("memory.notes.cart.sku"))  # a string has no keys
    assert not h.ever_existed


# --- previous and next change -------------------------------------------------------------


def test_around_a_step_gives_the_previous_and_next_change():
    run = chain({"n": 0}, {"n": 1}, {"n": 1}, {"n": 1}, {"n": 2}, {"n": 2})
    h = watch.history(run, parse_path("n"))
    assert [c.step for c in h.changes] == [1, 4]

    before, at, after = h.around(3)
    assert (before.step, at, after.step) == (1, None, 4)
    before, at, after = h.around(4)
    assert (before.step, at.step, after) == (1, 4, None)
    before, at, after = h.around(1)
    assert (before, at.step, after.step) == (None, 1, 4)


# --- path syntax --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("memory.notes.cart", ("memory", "notes", "cart")),
        ("/memory/notes/cart", ("memory", "notes", "cart")),
        ("$.memory.notes.cart", ("memory", "notes", "cart")),
        ("messages.3.content", ("messages", 3, "content")),
        ("messages[3].content", ("messages", 3, "content")),
        ("/messages/3/content", ("messages", 3, "content")),
        ("history[-1]", ("history", -1)),
        ('notes["a b"].x', ("notes", "a b", "x")),
        ("notes['it''s']", None),
        ("/a~1b/~0c", ("a/b", "~c")),
        ("cart-items.0", ("cart-items", 0)),
    ],
)
def test_paths_are_pointers_or_dotted(text, path):
    if path is None:
        with pytest.raises(PathSyntaxError):
            parse_path(text)
    else:
        assert parse_path(text) == path
        assert parse_path(watch.format_path(path)) == path
        assert parse_path(watch.pointer(path)) == tuple(
            str(s) if isinstance(s, int) and s < 0 else s for s in path
        )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "give the path"),
        ("   ", "give the path"),
        ("$", "give the path"),
        ("a..b", "expected a key"),
        ("a[", "bracket"),
        ("a[x]", "bracket"),
        ("a.b]", "expected . or ["),
        ("/a~2", "escape"),
        ("x" * 10_000, "10,000 characters long; at most 1,000"),
        ("a" + ".a" * 70, "deep"),
        ("a\x00b", "NUL"),
    ],
)
def test_bad_paths_are_refused_with_a_reason(text, says):
    with pytest.raises(PathSyntaxError, match=None) as exc:
        parse_path(text)
    assert says in str(exc.value)


def test_keys_a_text_column_cannot_hold_are_indexed_and_watched():
    run = chain({"k\ud800": {"a\x00b": 1}}, {"k\ud800": {"a\x00b": 2}})
    assert changes(run, '["k\\ud800"]["a\\u0000b"]') == [(1, "post", "set", 1, 2)]


def test_recorded_values_stay_as_they_were_when_later_steps_change_inside_them():
    run = chain(
        {"items": [{"v": 1, "w": [1]}]},
        {"items": [{"v": 2, "w": [1]}]},
        {"items": [{"v": 2, "w": [1, 2]}], "x": 1},
        {"items": [{"v": 2, "w": [1, 2]}, {"v": 9, "w": []}]},
    )
    assert changes(run, "items[0]") == [
        (1, "post", "set", {"v": 1, "w": [1]}, {"v": 2, "w": [1]}),
        (2, "post", "set", {"v": 2, "w": [1]}, {"v": 2, "w": [1, 2]}),
    ]


def test_the_history_agrees_with_every_state_rebuilt_in_full():
    """Random edits of lists and objects: a change is reported at exactly the snapshots
    where the value at the path differs from the one before, with those two values."""
    import random

    from agentrun.store.delta import canonical

    rng = random.Random(7)
    state = {"a": [{"k": 0, "v": [0]}], "b": {"c": {"d": 0}}}
    states = [state]
    for step in range(1, 120):
        s = json.loads(json.dumps(states[-1]))
        r = rng.random()
        if r < 0.25:
            s["a"].append({"k": step, "v": [step]})
        elif r < 0.4 and s["a"]:
            s["a"].pop(rng.randrange(len(s["a"])))
        elif r < 0.55 and s["a"]:
            s["a"].insert(rng.randrange(len(s["a"]) + 1), {"k": -step, "v": []})
        elif r < 0.7 and s["a"]:
            s["a"][rng.randrange(len(s["a"]))]["v"].append(step)
        elif r < 0.8:
            s["b"] = {**s["b"], "c": {"d": step}}
        elif r < 0.85:
            s["b"] = {"c": {"d": step}} if rng.random() < 0.5 else {}
        elif r < 0.9:
            s["a"] = s["a"][-3:]
        states.append(s)
    run = chain(*states)
    for text in ("a[0]", "a[1].v", "a[2].k", "a[-1].v", "b.c.d", "b.c", "a[5]"):
        path = parse_path(text)
        expected = rebuilt_changes(run, path)
        got = [(c.step, c.before, c.after) for c in watch.history(run, path).changes]

        def key(rows):
            return [
                (
                    i,
                    repr(b) if b is MISSING else canonical(b),
                    repr(a) if a is MISSING else canonical(a),
                )
                for i, b, a in rows
            ]

        assert key(got) == key(expected), text


def _random_list_states(seed: int, steps: int) -> list[dict]:
    """A list that mostly grows at its end, with now and then an insert, a removal, a
    cut of its head, several edits in one step, or the list replaced."""
    import random

    rng = random.Random(seed)
    states = [{"log": [{"n": 0}], "other": 0}]
    for step in range(1, steps):
        s = json.loads(json.dumps(states[-1]))
        log = s["log"]
        r = rng.random()
        if r < 0.55:
            log.extend({"n": step, "i": j} for j in range(rng.randint(1, 3)))
        elif r < 0.62 and log:
            del log[rng.randrange(len(log)) : rng.randrange(len(log) + 1) + 1]
        elif r < 0.7:
            log.insert(rng.randrange(len(log) + 1), {"n": -step})
        elif r < 0.75 and len(log) > 4:
            s["log"] = log[rng.randint(1, 4) :]
        elif r < 0.82 and log:
            log[rng.randrange(len(log))]["n"] = step * 10
            log.append({"n": step})
        elif r < 0.85:
            s["log"] = [{"n": step}] if rng.random() < 0.5 else []
        else:
            s["other"] = step
        states.append(s)
    return states


@pytest.mark.parametrize("padded", [True, False], ids=["deltas", "with-keyframes"])
def test_an_item_of_a_mostly_growing_list_agrees_with_every_state_rebuilt_in_full(padded):
    """Splices that start after the watched item are not read; the ones before it that
    shift items (inserts, removals, cuts) are, and give the same history as full states."""
    from agentrun.store.delta import canonical

    # Unpadded, keyframes now and then: the deltas soon outweigh the small state.
    run = chain(*_random_list_states(11, 160), pad=padded)
    if not padded:
        assert Snapshot.objects.filter(run=run, kind="full").count() > 3

    def key(rows):
        return [
            (
                i,
                canonical(b) if b is not MISSING else "-",
                canonical(a) if a is not MISSING else "-",
            )
            for i, b, a in rows
        ]

    for text in ("log[0]", "log[0].n", "log[1]", "log[3].n", "log[12]", "log[40].n", "log[-1].n"):
        path = parse_path(text)
        expected = rebuilt_changes(run, path)
        last = watch.resolve(snapshots.history(run.pk)[-1][1], path)
        got = watch.history(run, path)
        assert key([(c.step, c.before, c.after) for c in got.changes]) == key(expected), text
        assert watch.same(got.current, last), text
        assert watch.same(watch.value_now(run, path), last), text
        paged = watch.history(run, path, limit=3)
        assert key([(c.step, c.before, c.after) for c in paged.changes]) == key(expected[:3]), text
        assert watch.same(paged.current, last), text


def test_a_watch_of_an_early_item_is_not_handed_the_appends_to_its_list():
    states = [{"log": [{"n": 0}, {"n": 1}]}]
    for step in range(1, 300):
        log = [*states[-1]["log"], {"n": step + 1}]
        if step == 150:
            log[1] = {"n": "changed"}
        states.append({"log": log})
    run = chain(*states)
    # Appends that start at 2 to 9 have as many digits as 1: those few are read.
    for text, most in (("log[0].n", 2), ("log[1].n", 12)):
        read = watch.history(run, parse_path(text))
        assert read.snapshots_read <= most, (text, read.snapshots_read)
    assert changes(run, "log[1].n") == [(150, "post", "set", 1, "changed")]
    assert changes(run, "log[0].n") == []
    # The last item changes at every step: every append is read.
    assert watch.history(run, parse_path("log[-1].n")).snapshots_read >= 299
    assert watch.value_now(run, parse_path("log[1].n")) == "changed"


def test_a_window_that_drops_its_head_every_step_is_followed_from_the_deltas_alone():
    states = [{"log": [{"n": 0}, {"n": 1}, {"n": 2}]}]
    for step in range(1, 120):
        states.append({"log": [*states[-1]["log"][1:], {"n": step + 2}]})
    run = chain(*states)
    got = watch.history(run, parse_path("log[0].n"))
    assert [(c.step, c.before, c.after) for c in got.changes] == [
        (step, step - 1, step) for step in range(1, 120)
    ]
    # Every step's delta is read once: the list is whole, no state is read again.
    assert got.snapshots_read <= 121, got.snapshots_read


def test_a_fork_goes_on_from_its_parents_list_held_up_to_the_watched_item():
    """The parent appends (not read for log[0]); the fork drops the head every step."""
    states = [{"log": [{"n": 0}]}]
    for step in range(1, 30):
        states.append({"log": [*states[-1]["log"], {"n": step}]})
    parent = chain(*states)
    source = Snapshot.objects.get(run=parent, step=29, at="post")
    fork = Run.objects.create(
        agent="scripted", input={}, status="succeeded", parent=parent, forked_from=source
    )
    state = snapshots.load(parent.pk, 29, "post")
    prev, node = snapshots.fork(fork.pk, 30, source, state, state)
    prev.save()
    for step in range(30, 35):
        new = {**state, "log": state["log"][1:]}
        prev, node = snapshots.build(fork.pk, step, "post", new, prev, state, prev_node=node)
        prev.save()
        state = new
    got = watch.history(fork, parse_path("log[0].n"))
    assert [(c.step, c.before, c.after, c.inherited) for c in got.changes] == [
        (step, step - 30, step - 29, False) for step in range(30, 35)
    ]
    assert got.current == 5


def test_a_value_every_step_changes_is_read_in_one_pass_without_the_keyframes_it_skips(
    monkeypatch,
):
    """`log[-1].n` changes at every step: its snapshots come from reads of the chain, not a
    query per batch, and a keyframe made by a step that changed only `big` is left out of
    those reads (its deltas are stored alone here: nothing needs its text)."""
    states = [{"log": [{"n": 0}], "big": ""}]
    quiet = range(100, 110)  # steps that change only big, a longer text each time
    for step in range(1, 200):
        if step in quiet:
            states.append({"log": states[-1]["log"], "big": f"{step}" * 400 * (step - 99)})
        else:
            states.append({"log": [*states[-1]["log"], {"n": step}], "big": states[-1]["big"]})
    run = chain(*states, pad=False)
    keyframes = Snapshot.objects.filter(run=run, kind="full", step__in=quiet, at="post")
    keyframe = keyframes.first()
    assert keyframe is not None, "the test needs a keyframe that only big changed"
    parts = []
    real = snapshots.chain_texts

    def spy(run_id, first, last, refs=False, keep=None):
        parts.append((first, last))
        return real(run_id, first, last, refs, keep)

    monkeypatch.setattr(snapshots, "chain_texts", spy)
    path = parse_path("log[-1].n")
    got = watch.history(run, path)
    assert [(c.step, c.before, c.after) for c in got.changes] == rebuilt_changes(run, path)
    assert len(got.changes) == 199 - len(quiet)
    assert parts, "the dense read did not go through the chain"
    assert all(not first <= keyframe.seq <= last for first, last in parts), parts
    assert got.current == 199


def engine_chain(*states: dict) -> Run:
    """chain(), stored as the engine stores snapshots: each delta packed against its
    keyframe's text (snapshots.insert_values), which a reader must then read first."""
    run = Run.objects.create(agent="scripted", input={}, status="succeeded")
    prev = prev_state = None
    for i, state in enumerate(states):
        step, at = (1, "pre") if i == 0 else (i, "post")
        snap, _ = snapshots.build(run.pk, step, at, state, prev, prev_state)
        values, text = snapshots.insert_values(snap)
        Snapshot(**values).save()
        snapshots.committed(snap, text)
        prev, prev_state = snap, state
    codec.forget_dictionaries()  # a reader in another process: keyframes from the table
    snapshots.forget_keyframe_texts()
    return run


def test_deltas_packed_against_a_keyframe_the_watch_skips_read_the_same_history(monkeypatch):
    """The quiet steps' deltas are packed against a keyframe no change of `log` reaches:
    a dense read of `log[-1].n` leaves them compressed, so that keyframe is not read at all."""
    states = [{"log": [{"n": 0, "text": "entry 0"}], "big": ""}]
    quiet = range(100, 110)
    for step in range(1, 200):
        if step in quiet:
            states.append({"log": states[-1]["log"], "big": f"{step}" * 400 * (step - 99)})
        else:
            item = {"n": step, "text": f"entry {step} of the log"}
            states.append({"log": [*states[-1]["log"], item], "big": states[-1]["big"]})
    run = engine_chain(*states)
    from django.db.models import BinaryField, ExpressionWrapper, F

    stored = ExpressionWrapper(F("data"), output_field=BinaryField())  # as stored, not decoded
    deltas = Snapshot.objects.filter(run=run, kind="delta").values_list(stored, flat=True)
    packed = [codec.packed_against(bytes(data), run.pk) for data in deltas]
    assert sum(seq is not None for seq in packed) > 100, "the deltas are packed"
    skipped = Snapshot.objects.filter(run=run, kind="full", step__in=quiet).first()
    assert skipped is not None, "the test needs a keyframe that only big changed"
    asked: list[bytes] = []
    real = codec.dictionaries

    def spy(wanted):
        asked.extend(wanted)
        return real(wanted)

    monkeypatch.setattr(codec, "dictionaries", spy)
    for text in ("log[-1].n", "log[-1]", "log[-2].text", "big"):
        if text == "big":
            assert codec.dictionary_key(run.pk, skipped.seq) not in asked
        path = parse_path(text)
        got = watch.history(run, path)
        assert [(c.step, c.before, c.after) for c in got.changes] == rebuilt_changes(run, path)
        assert watch.same(got.current, watch.resolve(states[-1], path)), text
