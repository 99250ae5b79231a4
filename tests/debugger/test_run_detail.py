"""The run page: header, phase strip, compact list, one step body, live updates."""

from __future__ import annotations

import html as htmllib
import re

import pytest

from agentrun.models import Run
from tests.base import drive
from tests.debugger import runs
from tests.debugger.conftest import hx

pytestmark = pytest.mark.django_db


def test_the_header_shows_status_phase_agent_version_timings_and_tokens(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    Run.objects.filter(pk=run.pk).update(tokens_in=1234, tokens_out=56)
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert "succeeded" in html and 'class="phase ph-done"' in html
    assert run.agent_version in html
    assert "1234 in · 56 out" in html
    assert "Refunded 42.50 and held two replacement widgets." in html


def test_the_strip_has_one_cell_per_step_marking_failed_and_selected_ones(client_for, people):
    run = runs.failing_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/")
    html = response.content.decode()
    cells = re.findall(r'<a href="[^"]+" data-n="(\d+)" class="cell ([^"]+)"', html)
    assert [n for n, _ in cells] == ["1", "2", "3"]
    assert "failed" in cells[2][1] and "ph-error" in cells[2][1]
    assert "sel" in cells[2][1]  # a failed run opens at the failing step
    assert response.context["selected"] == 3
    assert "warehouse API returned 503" in html and "Traceback" in html


def test_a_waiting_run_opens_at_the_waiting_step_with_the_call_awaiting_approval(
    client_for, people
):
    run = runs.waiting_run(people["operator"])
    response = client_for("operator").get(f"/runs/{run.pk}/")
    assert response.context["selected"] == 2
    html = response.content.decode()
    assert "Waiting for approval" in html and "ledger_write" in html
    assert 'class="cell ph-reflecting waiting' in html
    assert "awaiting approval" in html


def test_a_step_url_selects_that_step(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/6/")
    assert response.context["selected"] == 6
    html = response.content.decode()
    assert 'data-step="6"' in html
    assert "Re-read the order with the new evidence" in html
    assert f"{run.pk}:6:0:echo:" in html and f"{run.pk}:6:1:echo:" in html
    assert f'rel="prev" class="btn ghost" href="/runs/{run.pk}/steps/5/"' in html
    assert f'rel="next" class="btn ghost" href="/runs/{run.pk}/steps/7/"' in html


def test_htmx_gets_only_the_step_body(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    response = client_for("viewer").get(f"/runs/{run.pk}/steps/3/", **hx("step-body"))
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="step-body"') and "<html" not in body
    assert 'id="strip"' not in body
    assert "ledger_write" in body and "kind-write" in body
    # A finished step in a finished run doesn't poll.
    assert "hx-trigger" not in body.split(">", 1)[0]
    # ...and a history restore gets the whole page.
    restore = client_for("viewer").get(
        f"/runs/{run.pk}/steps/3/",
        HTTP_HX_REQUEST="true",
        HTTP_HX_HISTORY_RESTORE_REQUEST="true",
        HTTP_HX_TARGET="step-body",
    )
    assert b"<html" in restore.content


def test_tool_call_attempts_show_their_errors_and_backoff(client_for, people):
    from agentrun.models import ToolCall

    run = runs.walkthrough_run(people["operator"])
    call = ToolCall.objects.get(run=run, step__number=4)
    call.attempts = [
        {
            "at": "2026-01-01T10:00:00+00:00",
            "started": True,
            "ended": True,
            "duration_ms": 12.0,
            "error": "TransientToolError: timeout",
            "backoff_s": 0.4,
        },
        {
            "at": "2026-01-01T10:00:01+00:00",
            "started": True,
            "ended": True,
            "duration_ms": 3.0,
            "error": None,
        },
    ]
    call.save()
    html = client_for("viewer").get(f"/runs/{run.pk}/steps/4/").content.decode()
    assert "TransientToolError: timeout" in html and "0.40 s" in html
    assert "2 attempts · 15 ms" in html


def test_the_page_has_step_durations_and_state_sizes_as_inline_svg(client_for, people):
    run = runs.walkthrough_run(people["operator"])
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert html.count('<svg class="chart"') == 2
    assert 'class="bar-ok"' in html and 'class="line"' in html


def test_live_updates_poll_while_active_and_stop_when_finished(client_for, people):
    run = runs.queued_run(people["operator"])
    client = client_for("viewer")
    html = client.get(f"/runs/{run.pk}/").content.decode()
    poll = htmllib.unescape(re.search(r'hx-get="(/runs/[^"]+/live/\?[^"]*v=[^"]+)"', html).group(1))
    assert 'class="stepbody empty"' in html and 'id="run-search" hidden' in html
    # As the page's script asks: no step shown, no search form.
    poll += "&open=1&shown=&form=0"
    assert client.get(poll, **hx("run-live")).status_code == 204  # nothing changed
    drive(run)
    response = client.get(poll, **hx("run-live"))
    assert response.status_code == 286  # finished: swap in the final state, stop polling
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="run-live"')
    assert 'id="step-list"' in body and 'hx-swap-oob="true"' in body
    assert "succeeded" in body
    # What a fresh load would show: the opening step and the search form, swapped in.
    fresh = client.get(f"/runs/{run.pk}/").content.decode()
    opened = re.search(r'<section id="step-body"[^>]*data-step="(\d+)"', fresh).group(1)
    assert re.search(rf'<section id="step-body" hx-swap-oob="true"[^>]*data-step="{opened}"', body)
    assert '<form id="run-search" hx-swap-oob="true"' in body
    # A step the operator picked is left alone; the page's own pick follows to the end.
    picked = client.get(poll.replace("shown=", "shown=1").replace("open=1&", ""), **hx("run-live"))
    assert 'id="step-body"' not in picked.content.decode()
    same = client.get(poll.replace("shown=", f"shown={opened}"), **hx("run-live"))
    assert 'id="step-body"' not in same.content.decode()  # already the one a load opens


def test_an_unfinished_step_body_polls_until_it_is_done(client_for, people):
    run = runs.waiting_run(people["operator"])
    client = client_for("operator")
    body = client.get(f"/runs/{run.pk}/steps/2/", **hx("step-body")).content.decode()
    poll = re.search(r'hx-get="([^"]+\?v=[^"]+)" hx-trigger="every 2s"', body).group(1)
    assert client.get(poll, **hx("step-body")).status_code == 204
    client.post(f"/runs/{run.pk}/approval/", {"decision": "approve"})
    drive(run)
    response = client.get(poll, **hx("step-body"))
    assert response.status_code == 286
    assert "hx-trigger" not in response.content.decode().split(">", 1)[0]


def test_a_run_with_no_steps_yet_says_so(client_for, people):
    run = runs.queued_run(people["operator"])
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert "No steps yet" in html and "Select a step" in html


def test_a_fork_links_to_its_parent_and_the_parent_lists_its_forks(client_for, people):
    parent = runs.walkthrough_run(people["operator"])
    child = runs.queued_run(people["operator"])
    snap = parent.snapshots.get(step=3, at="post")
    Run.objects.filter(pk=child.pk).update(parent=parent, forked_from=snap, mode="sandbox")
    client = client_for("viewer")
    child_html = client.get(f"/runs/{child.pk}/").content.decode()
    assert f'href="/runs/{parent.pk}/steps/3/post/">step 3 (post)</a>, sandbox mode' in child_html
    parent_html = client.get(f"/runs/{parent.pk}/").content.decode()
    assert f'href="/runs/{child.pk}/"' in parent_html


def test_a_running_step_shows_the_read_calls_its_decision_asked_for_before_they_are_recorded(
    client_for, people
):
    from agentrun import engine
    from agentrun.models import Step, ToolCall
    from tests.base import calls, final, make_run, script

    run = make_run(
        script(
            calls({"tool": "echo", "args": {"q": "stock of widgets"}}, thought="Look it up"),
            final(),
        ),
        user=people["operator"],
    )
    ctx = engine.claim(str(run.pk), 1, "test-worker")
    decision = engine.decide.decide_step(ctx)  # decided and recorded; the read call has not run yet
    assert not isinstance(decision, engine.Outcome)
    assert not ToolCall.objects.filter(run=run).exists()
    assert Step.objects.get(run=run, number=1).status == "running"
    html = client_for("viewer").get(f"/runs/{run.pk}/?step=1").content.decode()
    assert "Look it up" in html
    assert '<span class="tool">echo</span>' in html and "stock of widgets" in html
    assert (
        "recorded with the call&#x27;s result" in html or "recorded with the call's result" in html
    )
