"""Replay from here: the fork form, lineage and fork tree on the run page, the compare view."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest

from agentrun.lifecycle import services
from agentrun.models import Event, Run, ToolCall
from agentrun.store import snapshots
from tests.base import calls, drive, final, make_run, script
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def parent(people):
    """Eight steps; reserve (hybrid) at 2, ledger_write (write) at 3, notify (write) at 5."""
    return runs.walkthrough_run(people["operator"])


def fork_url(run: Run, step: int = 3, at: str = "pre") -> str:
    return f"/runs/{run.pk}/steps/{step}/{at}/fork/"


def state_of(run: Run, step: int = 3, at: str = "pre") -> dict:
    return snapshots.load(run.pk, step, at)


def post(client, run, state=None, step=3, at="pre", **fields):
    data = {"mode": "sandbox", "reason": "", **fields}
    data["state"] = (
        json.dumps(state_of(run, step if step < 99 else 3, at), indent=2)
        if state is None
        else state
    )
    return client.post(fork_url(run, step, at), data)


def counts() -> tuple[int, int]:
    return Run.objects.count(), Event.objects.count()


def textarea(html: str, raw: bool = False) -> str:
    """The editor's text as the browser shows it (or as sent, escaped, with raw)."""
    text = re.search(r'<textarea id="fork-state"[^>]*>\n(.*?)</textarea>', html, re.S).group(1)
    return text if raw else htmllib.unescape(text)


# --- who may fork ---------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in(client_for, parent):
    client = client_for(None)
    for response in (client.get(fork_url(parent)), post(client, parent)):
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("who", ["viewer", "outsider"])
def test_viewers_and_users_without_a_role_get_403_and_nothing_is_created(client_for, parent, who):
    client = client_for(who)
    before = counts()
    assert client.get(fork_url(parent)).status_code == 403
    assert post(client, parent).status_code == 403
    assert counts() == before


@pytest.mark.parametrize("who", ["operator", "admin"])
def test_operators_and_admins_get_the_form(client_for, parent, who):
    assert client_for(who).get(fork_url(parent, 6, "post")).status_code == 200


def test_replay_from_here_is_on_every_snapshot_for_operators_only(client_for, parent):
    operator, viewer = client_for("operator"), client_for("viewer")
    for n in (1, 6):
        for url, target in (
            (f"/runs/{parent.pk}/steps/{n}/pre/", fork_url(parent, n, "pre")),
            (f"/runs/{parent.pk}/steps/{n}/post/", fork_url(parent, n, "post")),
            (f"/runs/{parent.pk}/steps/{n}/diff/", fork_url(parent, n, "pre")),
        ):
            html = operator.get(url, **hx("snap-pane")).content.decode()
            assert f'href="{target}" data-action="replay"' in html, url
            # The button itself says which state the fork starts from.
            side = "after" if target.endswith("/post/fork/") else "before"
            assert re.search(rf'data-action="replay"[^>]*>Replay from {side} step {n}</a>', html)
            assert 'data-action="replay"' not in viewer.get(url).content.decode(), url


def test_the_form_is_prefilled_with_the_snapshot_state_as_pretty_json(client_for, parent):
    response = client_for("operator").get(fork_url(parent, 6, "pre"))
    html = response.content.decode()
    assert json.loads(textarea(html)) == state_of(parent, 6)
    assert '\n  "schema_version": 1,' in textarea(html)  # pretty: one key a line
    assert 'name="mode" value="sandbox" checked' in html
    assert 'name="mode" value="recorded">' in html and 'name="mode" value="live">' in html
    for words in ("never executed", "first divergence", "own idempotency keys"):
        assert words in html
    assert "Re-read the order with the new evidence" in html  # the step being replayed


def test_an_unknown_snapshot_has_no_form(client_for, parent):
    client = client_for("operator")
    assert client.get(fork_url(parent, 99)).status_code == 404
    assert client.get(f"/runs/{parent.pk}/steps/3/middle/fork/").status_code == 404


# --- creating forks -----------------------------------------------------------------------------


def test_an_unchanged_sandbox_fork_redirects_to_the_new_run(client_for, people, parent):
    client = client_for("operator")
    response = post(client, parent, reason="look again")
    fork = Run.objects.get(parent=parent)
    assert response.status_code == 302 and response["Location"] == f"/runs/{fork.pk}/"
    assert (fork.mode, fork.first_step, fork.created_by) == ("sandbox", 3, people["operator"])
    event = Event.objects.get(run=fork, kind="run_forked")
    assert (event.actor, event.reason, event.payload["edited"]) == ("olga", "look again", False)
    page = client.get(response["Location"]).content.decode()
    assert "Forked from step 3 (pre) in sandbox mode." in page


def test_an_edited_state_is_forked_and_its_event_records_the_edit(client_for, parent):
    state = state_of(parent, 6, "post")
    state["memory"]["notes"]["evidence"] = "video checked by Olga"
    post(client_for("operator"), parent, json.dumps(state), step=6, at="post")
    fork = Run.objects.get(parent=parent)
    assert fork.first_step == 7
    assert snapshots.load(fork.pk, 7, "pre") == state
    event = Event.objects.get(run=fork, kind="run_forked")
    assert event.payload["edited"] is True
    assert event.payload["edits"] == [
        ["set", ["memory", "notes"], {"evidence": "video checked by Olga"}]
    ]


def test_reformatting_the_json_is_not_an_edit(client_for, parent):
    compact = json.dumps(state_of(parent), separators=(",", ":"), sort_keys=True)
    post(client_for("operator"), parent, compact)
    fork = Run.objects.get(parent=parent)
    assert Event.objects.get(run=fork, kind="run_forked").payload["edited"] is False


def test_an_untouched_state_may_be_left_out_of_the_post(client_for, parent):
    client = client_for("operator")
    assert "data-pristine" in client.get(fork_url(parent)).content.decode()
    response = client.post(fork_url(parent), {"mode": "recorded", "state_unchanged": "1"})
    fork = Run.objects.get(parent=parent)
    assert response["Location"] == f"/runs/{fork.pk}/"
    assert Event.objects.get(run=fork, kind="run_forked").payload["edited"] is False
    # An edited state, sent back with an error elsewhere, must travel again.
    state = state_of(parent)
    state["memory"]["goal"] = "another goal"
    html = post(client, parent, json.dumps(state), mode="live").content.decode()
    assert "data-pristine" not in html


def test_a_recorded_fork(client_for, parent):
    post(client_for("operator"), parent, mode="recorded")
    fork = drive(Run.objects.get(parent=parent))
    assert (fork.mode, fork.status, fork.divergence_step) == ("recorded", "succeeded", None)


def test_the_live_form_lists_the_side_effects_that_would_run_again(client_for, parent):
    html = client_for("operator").get(fork_url(parent, 3, "pre")).content.decode()
    section = html.split('class="live-effects', 1)[1].split("</section>", 1)[0]
    for call in ToolCall.objects.filter(run=parent, step__number__gte=3, kind="write"):
        assert call.tool in section and call.idempotency_key in section
    assert "reserve" not in section  # step 2 is before the fork point
    assert "ledger_write" in section and "notify" in section
    assert "&quot;account&quot;: &quot;refunds&quot;" in section  # args, escaped
    assert "I understand these run again, with new idempotency keys" in section


def test_a_live_fork_needs_the_confirmation(client_for, parent):
    client = client_for("operator")
    before = counts()
    response = post(client, parent, mode="live")
    assert response.status_code == 400
    assert counts() == before
    html = response.content.decode()
    assert re.search(r'name="mode" value="live" checked', html)
    errors = html.split('class="live-effects has-error">', 1)[1]
    assert "confirm it" in errors.split("</section>", 1)[0]
    response = post(client, parent, mode="live", confirm_live="on")
    fork = Run.objects.get(parent=parent)
    assert response["Location"] == f"/runs/{fork.pk}/" and fork.mode == "live"


def test_a_live_fork_after_the_last_side_effect_needs_no_confirmation(client_for, parent):
    html = client_for("operator").get(fork_url(parent, 6)).content.decode()
    assert "repeats none of its side effects" in html
    assert post(client_for("operator"), parent, step=6, mode="live").status_code == 302


def _bogus_phase(state):
    state["phase"] = "bogus"
    return json.dumps(state, indent=2)


def _notes_as_list(state):
    state["memory"]["notes"] = ["a", "b"]
    return json.dumps(state, indent=2)


@pytest.mark.parametrize(
    ("case", "field", "message"),
    [
        ("json", "state", "Invalid JSON at line 3, column 3: Expecting &#x27;,&#x27; delimiter."),
        ("nan", "state", "Invalid JSON: NaN is not allowed in JSON."),
        ("huge", "state", "Invalid JSON: number out of range: 1e999."),
        ("long", "state", "Invalid JSON: integer too long (4000 digits)."),
        ("phase", "state", "state: phase: unknown phase &#x27;bogus&#x27;"),
        ("notes", "state", "state: memory.notes must be an object, got array"),
        ("mode", "mode", "Choose sandbox, recorded or live (not turbo)."),
        ("step", None, "run has no pre snapshot of step 99 (steps 1..8)"),
        ("empty", "state", "The state can&#x27;t be empty"),
    ],
)
def test_bad_input_is_shown_inline_and_creates_nothing(client_for, parent, case, field, message):
    state = state_of(parent)
    text = json.dumps(state, indent=2)
    fields: dict = {}
    step = 3
    if case == "json":
        text = '{\n  "phase": "planning"\n  "memory": {}\n}'
    elif case == "nan":
        text = '{"iteration": NaN}'
    elif case == "huge":
        text = '{"iteration": 1e999}'
    elif case == "long":
        text = '{"iteration": ' + "7" * 4000 + "}"
    elif case == "phase":
        text = _bogus_phase(state)
    elif case == "notes":
        text = _notes_as_list(state)
    elif case == "mode":
        fields["mode"] = "turbo"
    elif case == "step":
        step = 99
    elif case == "empty":
        text = ""
    before = counts()
    response = post(client_for("operator"), parent, text, step=step, **fields)
    assert response.status_code == 400
    assert counts() == before
    html = response.content.decode()
    assert message in html
    if field == "state":  # next to the editor, which keeps the operator's text
        head, editor = html.split('<textarea id="fork-state"', 1)
        assert message in head.rsplit('class="editor-head"', 1)[1]
        assert 'class="json-editor invalid"' in html
    elif field == "mode":
        assert message in html.split('class="modes"', 1)[1].split('class="live-effects', 1)[0]
    else:
        assert message in html.split('class="callout bad" role="alert"', 1)[1][:300]
    if text:
        assert textarea(html) == text


def test_preview_shows_the_changes_and_creates_nothing(client_for, parent):
    state = state_of(parent)
    state["memory"]["goal"] = "Refund order 1042, no stock"
    before = counts()
    response = post(client_for("operator"), parent, json.dumps(state), preview="1")
    assert response.status_code == 200 and counts() == before
    html = response.content.decode()
    changes = html.split('id="fork-changes"', 1)[1]
    assert "1 changed in memory" in changes and "memory.goal" in changes
    assert "the snapshot → your edited state" in changes
    broken = _notes_as_list(state_of(parent))
    response = post(client_for("operator"), parent, broken, preview="1")
    assert response.status_code == 400 and counts() == before
    assert "memory.notes must be an object" in response.content.decode()


def test_the_state_text_is_escaped_in_the_editor(client_for, parent):
    state = state_of(parent)
    state["memory"]["notes"]["x"] = "</textarea><script>alert(1)</script>"
    text = json.dumps(state, indent=2) + "\n,"  # invalid: the form comes back with it
    html = post(client_for("operator"), parent, text).content.decode()
    assert "<script>alert(1)" not in html and "</textarea><script>" not in html
    assert "&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in textarea(html, raw=True)
    assert textarea(html) == text


# --- lineage and the fork tree -----------------------------------------------------------------


@pytest.fixture
def family(people, parent):
    """parent → child (step 3 pre, sandbox) → grandchild (step 5 post, recorded); a second child."""
    olga = people["operator"]
    child = drive(services.fork_run(parent, step=3, at="pre", user=olga, reason="why not"))
    grandchild = drive(services.fork_run(child, step=5, at="post", mode="recorded", user=olga))
    other = services.fork_run(parent, step=6, at="post", mode="live", user=olga)
    return parent, child, grandchild, other


def test_a_fork_says_where_it_comes_from_and_links_its_lineage(client_for, family):
    parent, child, grandchild, _ = family
    html = client_for("viewer").get(f"/runs/{grandchild.pk}/").content.decode()
    banner = html.split('class="callout forkinfo"', 1)[1].split("</ol>", 1)[0]
    text = re.sub(r"<[^>]+>", "", banner)
    assert f"Fork of {str(child.pk)[:8]} from step 5 (post), recorded mode" in text
    assert "replayed identically so far" in text
    assert f'href="/runs/{grandchild.pk}/compare/" data-action="compare">Compare with parent' in (
        banner
    )
    chain = banner.split('class="lineage"', 1)[1]
    assert chain.index(f'href="/runs/{parent.pk}/"') < chain.index(f'href="/runs/{child.pk}/"')
    assert "step 3 pre" in chain and "step 5 post" in chain
    assert 'mode-badge mode-sandbox">sandbox' in chain and 'mode-recorded">recorded' in chain
    child_html = client_for("viewer").get(f"/runs/{child.pk}/").content.decode()
    assert "Fork of" in child_html and "sandbox mode" in child_html
    assert "“why not”" in child_html


def test_a_run_lists_its_forks_and_their_forks(client_for, family):
    parent, child, grandchild, other = family
    html = client_for("viewer").get(f"/runs/{parent.pk}/").content.decode()
    assert 'class="callout forkinfo"' not in html  # not a fork itself
    tree = html.split('class="forktree"', 1)[1].split("</div>", 1)[0]
    assert tree.index(str(child.pk)[:8]) < tree.index(str(grandchild.pk)[:8])
    nested = tree.split(f'href="/runs/{child.pk}/"', 1)[1].split("</li>\n        <li>", 1)[0]
    assert f'href="/runs/{grandchild.pk}/"' in nested.split("<ul>", 1)[1]
    assert f'href="/runs/{other.pk}/"' in tree
    assert "from step 6 post" in tree and 'mode-live">live' in tree
    assert 'badge st-succeeded">succeeded' in tree and 'badge st-queued">queued' in tree


def test_a_recorded_fork_that_diverged_says_where(client_for, people, parent):
    state = state_of(parent, 4)
    state["memory"]["notes"]["ledger"] = "balance checked by hand"
    fork = drive(
        services.fork_run(parent, step=4, state=state, mode="recorded", user=people["operator"])
    )
    assert fork.divergence_step == 4
    html = client_for("viewer").get(f"/runs/{fork.pk}/").content.decode()
    assert "diverged at step 4" in html and "state edited" in html
    assert f"/diff/?a={parent.pk}:4:pre&amp;b={fork.pk}:4:pre" in html


# --- compare -----------------------------------------------------------------------------------

SCRIPT = script(
    calls({"tool": "echo", "args": {"n": 1}}, thought="one"),
    calls({"tool": "echo", "args": {"n": 2}}, thought="two"),
    calls({"tool": "echo", "args": {"n": 3}}, thought="three"),
    calls({"tool": "notify", "args": {"to": "ana", "body": "hi"}}, thought="four"),
    final("done", thought="five"),
    goal="count to five",
)


@pytest.fixture
def edited_fork(people):
    """A five-step run and a sandbox fork from step 3 pre with an operator's note added."""
    parent = drive(make_run(SCRIPT, user=people["operator"]))
    state = snapshots.load(parent.pk, 3, "pre")
    state["memory"]["notes"]["hint"] = "count slower"
    fork = drive(services.fork_run(parent, step=3, state=state, user=people["operator"]))
    assert fork.status == "succeeded"
    return parent, fork


def rows(html: str) -> dict[int, str]:
    found = re.findall(r'<a class="crow([^"]*)" data-n="(\d+)"', html)
    return {int(n): classes.strip() for classes, n in found}


def test_compare_aligns_the_fork_with_its_parent_and_marks_the_first_divergence(
    client_for, edited_fork
):
    parent, fork = edited_fork
    response = client_for("viewer").get(f"/runs/{fork.pk}/compare/")
    assert response.status_code == 200
    html = response.content.decode()
    assert rows(html) == {
        1: "shared",
        2: "shared",
        3: "differs first-div sel",
        4: "differs",
        5: "differs",
    }
    cmp = response.context["cmp"]
    assert cmp.first_divergence == 3 and cmp.ancestor
    row3 = cmp.rows[2]
    assert (row3.pre_same, row3.post_same) == (False, False)
    assert "First divergence at step 3" in html and "first divergence</span>" in html
    # The edit made them differ before step 3 ran: the page does not blame the step.
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))
    assert (
        "the two runs' states differ already before this step: the fork started from an "
        "edited state, so they differ after it too." in said
    )
    assert "differ after this step" not in said
    assert "Compare <a" in html and "with its parent" in html
    # Both sides show the decision and the calls with their status.
    row4 = html.split('data-n="4"', 1)[1].split("</a>", 1)[0]
    assert row4.count(">four</span>") == 2
    assert 'notify <span class="cstat">ok</span>' in row4
    assert 'notify <span class="cstat">skipped</span>' in row4  # sandbox: not sent
    # The diff of the selected (first divergent) step, by the diff component.
    diff = html.split('id="compare-diff"', 1)[1]
    assert "memory.notes.hint" in diff and "count slower" in diff
    assert f'href="/runs/{parent.pk}/steps/3/post/"' in diff
    assert f'href="/runs/{fork.pk}/steps/3/post/"' in diff


def test_a_row_shows_its_diff_as_an_htmx_fragment_with_a_real_link(client_for, edited_fork):
    parent, fork = edited_fork
    client = client_for("viewer")
    html = client.get(f"/runs/{fork.pk}/compare/").content.decode()
    link = f"/runs/{fork.pk}/compare/?step=5"
    assert f'href="{link}" hx-get="{link}" hx-target="#compare-diff"' in html
    fragment = client.get(link, **hx("compare-diff")).content.decode()
    assert fragment.lstrip().startswith('<section id="compare-diff"') and "<html" not in fragment
    assert 'data-step="5"' in fragment and "memory.notes.hint" in fragment
    page = client.get(link).content.decode()  # the same URL as a whole page
    assert "<html" in page and rows(page)[5] == "differs sel"
    shared = client.get(f"/runs/{fork.pk}/compare/?step=1", **hx("compare-diff"))
    assert "the fork starts after it" in shared.content.decode()


def test_an_unedited_sandbox_fork_diverges_where_a_write_was_skipped(client_for, people):
    parent = drive(make_run(SCRIPT, user=people["operator"]))
    fork = drive(services.fork_run(parent, step=2, at="post", user=people["operator"]))
    response = client_for("viewer").get(f"/runs/{fork.pk}/compare/")
    assert response.context["cmp"].first_divergence == 4  # notify skipped instead of sent
    said = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", response.content.decode()))
    assert "the two runs' states are the same before this step and differ after it." in said
    assert rows(response.content.decode()) == {
        1: "shared",
        2: "shared",
        3: "",
        4: "differs first-div sel",
        5: "differs",
    }


def test_a_recorded_replay_that_matched_says_there_is_no_divergence(client_for, people):
    parent = drive(make_run(SCRIPT, user=people["operator"]))
    fork = drive(services.fork_run(parent, step=1, mode="recorded", user=people["operator"]))
    html = client_for("viewer").get(f"/runs/{fork.pk}/compare/").content.decode()
    assert "No divergence" in html and "every aligned step (5)" in html
    assert set(rows(html).values()) == {""}
    assert "Select a step" in html


def test_compare_with_any_other_run(client_for, edited_fork, people):
    parent, fork = edited_fork
    sibling = drive(services.fork_run(parent, step=4, user=people["operator"]))
    client = client_for("viewer")
    response = client.get(f"/runs/{fork.pk}/compare/?with={str(sibling.pk)[:8]}")
    assert response.status_code == 200 and response.context["other"] == sibling
    html = response.content.decode()
    assert "Compared with" in html and "its parent" not in html
    # The sibling starts at step 4 without the operator's note: step 3 is the fork's only.
    assert rows(html) == {3: "", 4: "differs first-div sel", 5: "differs"}
    assert "no step 3" in html
    assert f'href="/runs/{fork.pk}/compare/?with={str(sibling.pk)[:8]}&amp;step=4"' in html
    bad = client.get(f"/runs/{fork.pk}/compare/?with=nope")
    assert bad.status_code == 400 and "is not a valid run id" in bad.content.decode()


def test_a_run_that_is_no_fork_offers_its_forks(client_for, edited_fork):
    parent, fork = edited_fork
    response = client_for("viewer").get(f"/runs/{parent.pk}/compare/")
    html = response.content.decode()
    assert response.status_code == 200 and "is not a fork" in html
    assert f'href="/runs/{fork.pk}/compare/"' in html


def test_compare_needs_a_role(client_for, edited_fork):
    _, fork = edited_fork
    url = f"/runs/{fork.pk}/compare/"
    assert client_for(None).get(url)["Location"].startswith("/login/")
    assert client_for("outsider").get(url).status_code == 403
    assert client_for("viewer").get(url).status_code == 200


def test_a_fork_from_the_page_onto_a_code_version(client_for):
    from agentrun.models import Run
    from tests.base import drive, make_run

    run = drive(make_run())
    client = client_for("operator")
    page = client.get(f"/runs/{run.pk}/steps/1/pre/fork/")
    assert 'name="version"' in page.content.decode()
    state = page.context["form"]["state"].value()
    bad = client.post(f"/runs/{run.pk}/steps/1/pre/fork/",
                      {"state": state, "mode": "sandbox", "version": "two words"})  # fmt: skip
    assert bad.status_code == 400 and "a version is letters" in bad.content.decode()
    assert Run.objects.count() == 1
    done = client.post(f"/runs/{run.pk}/steps/1/pre/fork/",
                       {"state": state, "mode": "sandbox", "version": "v2"})  # fmt: skip
    assert done.status_code == 302
    assert Run.objects.exclude(pk=run.pk).get().target_version == "v2"
