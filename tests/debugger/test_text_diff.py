"""Inline text diffs: prose by words, short tokens (ids, numbers) by characters."""

from __future__ import annotations

import pytest

from debugger.diffs import diff_states, text_diff

OLD_LIST = "Packing list: Gas canister, 230 stakes, sleeping bag and a head torch for the walk."
NEW_LIST = "Packing list: Aluminium tent, stakes, sleeping bag and a head torch for the walk."


def sides(parts):
    """The old and the new text put back together from the parts."""
    old = "".join(t for tag, t in parts if tag in ("eq", "del"))
    new = "".join(t for tag, t in parts if tag in ("eq", "ins"))
    return old, new


def cuts_inside_a_word(parts) -> list[str]:
    """Changed pieces that start or end in the middle of a word of the text around them."""
    bad = []
    for n, (tag, text) in enumerate(parts):
        if tag not in ("del", "ins"):
            continue
        before = next((t for g, t in reversed(parts[:n]) if g in ("eq", tag)), "")
        after = next((t for g, t in parts[n + 1 :] if g in ("eq", tag)), "")
        if (before[-1:].isalnum() and text[:1].isalnum()) or (
            text[-1:].isalnum() and after[:1].isalnum()
        ):
            bad.append(text)
    return bad


def test_replaced_words_in_prose_are_shown_as_whole_phrases():
    parts = text_diff(OLD_LIST, NEW_LIST)
    assert sides(parts) == (OLD_LIST, NEW_LIST)
    assert ("del", "Gas canister, 230") in parts and ("ins", "Aluminium tent,") in parts
    assert cuts_inside_a_word(parts) == []
    # Not letters of one phrase interleaved with the other's, as in "GasAluminium canistertent".
    changed = [t for tag, t in parts if tag in ("del", "ins")]
    assert changed == ["Gas canister, 230", "Aluminium tent,"]


@pytest.mark.parametrize(
    "old, new",
    [
        (OLD_LIST, NEW_LIST),
        ("Bring: tent, gas, stove and the blue map", "Bring: tarp, gas, stove, mug and a map"),
        (
            "The customer says the box was wet when it arrived on Tuesday morning.",
            "The courier says the parcel was dry when it left the depot on Monday evening.",
        ),
        ("one two three four five six seven eight nine ten", "one 2 three 4 five 6 seven 8"),
        (
            "Print the shipping label and the customs form",
            "Print the shipment labels, customs forms",
        ),
    ],
)
def test_prose_is_never_cut_inside_a_word(old, new):
    parts = text_diff(old, new)
    assert sides(parts) == (old, new)
    assert cuts_inside_a_word(parts) == []


def test_short_tokens_are_compared_by_characters():
    assert text_diff("3f2a9c1e", "3f2a9c1f") == [("eq", "3f2a9c1"), ("del", "e"), ("ins", "f")]
    assert text_diff("order-1042", "order-1043") == [
        ("eq", "order-104"),
        ("del", "2"),
        ("ins", "3"),
    ]


def test_a_changed_number_or_word_in_prose_is_replaced_whole():
    parts = text_diff(
        "Refund order 1042 to the card ending 4417", "Refund order 1043 to the card ending 4417"
    )
    assert parts == [
        ("eq", "Refund order "),
        ("del", "1042"),
        ("ins", "1043"),
        ("eq", " to the card ending 4417"),
    ]
    parts = text_diff("Print the shipping label today", "Print the shipment label today")
    assert ("del", "shipping") in parts and ("ins", "shipment") in parts


def test_a_long_string_without_spaces_is_not_a_token():
    old, new = "a" * 50 + "b" * 50, "a" * 50 + "c" * 50
    assert text_diff(old, new) == [("del", old), ("ins", new)]


def test_the_diff_of_a_changed_note_uses_words():
    [change] = diff_states({"note": OLD_LIST}, {"note": NEW_LIST}).changes
    assert ("del", "Gas canister, 230") in change.text_diff
