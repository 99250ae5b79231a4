"""The run page's header: the run's labels as chips that lead to the filtered list, and its
input in a collapsible JSON tree, redacted, kept open across live refreshes."""

from __future__ import annotations

import json

import pytest

from agentrun.lifecycle import services
from agentrun.models import Run
from agentrun.security.redact import REDACTED
from tests.base import calls, drive, final, script
from tests.debugger.conftest import HX

pytestmark = pytest.mark.django_db

INCIDENT = {
    **script(calls({"tool": "echo", "args": {"x": 1}}), final("ok"), goal="camping trip"),
}


def started(labels=None, input=INCIDENT):
    return services.start_run("scripted", input, labels=labels)


def test_the_header_shows_the_labels_as_chips_linking_to_the_filtered_list(client_for, people):
    run = drive(started({"story": "stale-cart", "customer": "ben"}))

    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()

    assert 'class="runlabels"' in html
    assert '<a class="lchip" href="/?label=story%3Dstale-cart"' in html
    assert ">customer=ben</a>" in html
    # Sorted by key.
    assert html.index(">customer=ben<") < html.index(">story=stale-cart<")


def test_a_run_without_labels_has_no_label_line(client_for, people):
    run = started()
    assert 'class="runlabels"' not in client_for("viewer").get(f"/runs/{run.pk}/").content.decode()


def test_the_input_is_shown_as_a_collapsible_tree(client_for, people):
    cart = {"cart_changes": [{"after_step": 2, "remove": "STOVE-1"}]}
    run = started()
    Run.objects.filter(pk=run.pk).update(input={**INCIDENT, **cart})

    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()

    start = html.index('<details id="run-input" class="run-input" hx-preserve="true">')
    panel = html[start : html.index("</details>\n", start)]
    assert '<ul class="jt">' in panel
    assert ">cart_changes<" in panel and "STOVE-1" in panel and ">after_step<" in panel
    assert f'href="/runs/{run.pk}/input.json"' in panel


def test_the_input_is_redacted_on_the_page_and_in_the_download(client_for, people):
    run = started()
    # As a row written before redaction on the way in (or by hand) would hold it.
    leaky = {**INCIDENT, "openai_api_key": "sk-abcdefghijklmnop0123456789", "note": "token=s3cr3t"}
    Run.objects.filter(pk=run.pk).update(input=leaky)
    client = client_for("viewer")

    page = client.get(f"/runs/{run.pk}/").content.decode()
    download = client.get(f"/runs/{run.pk}/input.json")

    assert "sk-abcdefghijklmnop" not in page and "s3cr3t" not in page
    assert REDACTED in page
    assert download.status_code == 200
    assert download["Content-Type"].startswith("application/json")
    assert "attachment" in download["Content-Disposition"]
    data = json.loads(download.content)
    assert data["openai_api_key"] == REDACTED and data["note"] == f"token={REDACTED}"
    assert data["goal"] == "camping trip"


def test_the_input_download_needs_a_role(client_for, people):
    run = started()
    response = client_for("outsider").get(f"/runs/{run.pk}/input.json")
    assert response.status_code == 403
    assert client_for(None).get(f"/runs/{run.pk}/input.json").status_code == 302


def test_html_in_the_input_is_escaped(client_for, people):
    run = started()
    Run.objects.filter(pk=run.pk).update(input={**INCIDENT, "note": "<img src=x onerror=alert(1)>"})
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_the_live_refresh_keeps_the_open_panel_instead_of_sending_it_again(client_for, people):
    run = started({"story": "live"})  # queued: active, so the page polls
    response = client_for("viewer").get(f"/runs/{run.pk}/live/?v=stale", **HX)

    body = response.content.decode()
    assert response.status_code == 200
    # The element is there, empty: htmx keeps the one on the page (hx-preserve).
    assert '<details id="run-input" class="run-input" hx-preserve="true">' in body
    assert '<ul class="jt">' not in body
    assert ">story=live</a>" in body


def test_a_forks_input_is_its_parents(client_for, people):
    parent = drive(started({"story": "x"}))
    fork = services.fork_run(parent, step=2, at="pre")
    html = client_for("viewer").get(f"/runs/{fork.pk}/").content.decode()
    assert "(its parent&#x27;s)" in html or "(its parent's)" in html
    assert ">camping trip<" in html or "camping trip" in html.split('id="run-input"')[1]
    assert f">forked-from={str(parent.pk)[:8]}</a>" in html
