"""debugger.jsontree: a bounded, escaped, collapsible tree of a JSON value."""

from __future__ import annotations

import pytest

from debugger.jsontree import (
    PathError,
    TreeOptions,
    format_path,
    parse_path,
    peek,
    render_tree,
    resolve,
)


def opts(**kw):
    return TreeOptions(link=lambda path, start: f"/t?path={format_path(path)}&from={start}", **kw)


@pytest.mark.parametrize(
    "path",
    [
        (),
        ("a",),
        ("memory", "notes", "a b"),
        ("history", 3, "content"),
        ("x", 0, 1, "é", '"quoted"', "with.dot"),
    ],
)
def test_paths_print_and_parse_back(path):
    assert parse_path(format_path(path)) == path


def test_path_format():
    assert format_path(["memory", "notes", "a b", 3]) == 'memory.notes["a b"][3]'


@pytest.mark.parametrize("bad", ["..a", "a[", "a[x]", 'a["unterminated]', ".a"])
def test_bad_paths_are_refused(bad):
    with pytest.raises(PathError):
        parse_path(bad)


def test_resolve():
    state = {"a": [{"b": 1}]}
    assert resolve(state, ("a", 0, "b")) == 1
    with pytest.raises(KeyError):
        resolve(state, ("a", 1))


def test_everything_is_escaped():
    hostile = "<script>alert(1)</script>"
    html = render_tree({hostile: hostile, "list": [hostile], '"><img src=x>': 1}, opts())
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-path="[&quot;\\&quot;&gt;&lt;img src=x&gt;&quot;]"' in html


def test_types_and_sizes_are_shown():
    html = render_tree(
        {"n": 1, "f": 1.5, "b": True, "z": None, "s": "hi", "l": [1, 2], "o": {"k": "v"}}, opts()
    )
    for meta in (
        "integer",
        "number",
        "boolean",
        "null",
        "string · 2 chars",
        "array · 2 items",
        "object · 1 key",
    ):
        assert meta in html


def test_long_strings_are_cut_with_the_full_text_on_demand():
    html = render_tree({"s": "x" * 500}, opts())
    assert '"' + "x" * 160 + '…"' in html
    assert '<details class="jt-more"><summary>show all</summary>' in html and "x" * 500 in html


def test_the_budget_leaves_stubs_linking_to_subtrees():
    state = {f"k{i}": {"inner": list(range(50))} for i in range(20)}
    html = render_tree(state, opts(budget=100))
    assert 'class="jt-stub"' in html and "/t?path=k19" in html


def test_long_lists_show_the_newest_items_first():
    html = render_tree({"h": list(range(500))}, opts(per_container=100))
    assert 'data-path="h[499]"' in html and 'data-path="h[399]"' not in html
    assert "400 earlier" in html
    page = render_tree(list(range(500)), opts(per_container=100), path=("h",), start=0)
    assert 'data-path="h[0]"' in page and "400 more" in page


def test_peek_shows_the_first_fields_of_a_collapsed_container():
    assert (
        peek({"role": "user", "content": "hello", "x": [1]})
        == 'role: "user", content: "hello", x: […]'
    )
