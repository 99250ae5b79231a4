"""Code versions on a run's pages: the version it was created on, asks for and ran on (with
step ranges when several ran it), a warning when no live worker runs the version it asks for,
each step's version, and the compare page when the two runs ran on different code."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agentrun.lifecycle import services
from agentrun.models import Worker
from tests.base import drive
from tests.fleet.refunds import order
from tests.fleet.scenario import deploy_v2, incident

pytestmark = pytest.mark.django_db


def test_a_run_that_two_versions_ran_shows_each_with_its_steps(
    client_for, people, on_v1, monkeypatch
):
    run = drive(services.start_run("refunds", order(1, items=2)), max_steps=1)
    deploy_v2(monkeypatch)
    run = drive(run)
    assert run.status == "succeeded"
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert (
        'created on <span class="mono ver">v1</span> · ran on <span class="mono ver">v1</span>'
        ' <span class="sub">(step 1)</span>, <span class="mono ver">v2</span>'
        ' <span class="sub">(steps 2–3)</span>'
    ) in html
    assert 'id="version-note"><strong>Another version ran it:</strong> <span>created on' in html


def test_a_run_on_one_version_says_so_once_without_a_note(client_for, people, on_v1):
    run = incident(n_failing=0, n_fine=1)[0]
    html = client_for("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert (
        'created on <span class="mono ver">v1</span> · ran on <span class="mono ver">v1</span></dd>'
        in html
    )
    assert "version-note" not in html and "version-wait" not in html


def test_each_step_shows_the_version_that_ran_it(client_for, people, on_v1, monkeypatch):
    run = drive(services.start_run("refunds", order(1, items=2)), max_steps=1)
    deploy_v2(monkeypatch)
    drive(run)
    client = client_for("viewer")
    assert 'step-version" title="the code version of the worker that ran this step' in (
        client.get(f"/runs/{run.pk}/steps/1/").content.decode()
    )
    assert ">v1</span>" in client.get(f"/runs/{run.pk}/steps/1/").content.decode()
    assert 'step-version"' in client.get(f"/runs/{run.pk}/steps/3/").content.decode()
    assert ">v2</span>" in client.get(f"/runs/{run.pk}/steps/3/").content.decode()


def test_a_fork_that_asks_for_a_version_no_worker_runs_says_it_waits(client_for, people, on_v1):
    parent = incident(n_failing=1, n_fine=0)[0]
    fork = services.fork_run(parent, step=2, at="pre", mode="sandbox", version="v9")
    Worker.objects.create(name="host-a:1", version="v1", seen_at=timezone.now())
    client = client_for("viewer")
    html = client.get(f"/runs/{fork.pk}/").content.decode()
    assert 'asks for <span class="mono ver">v9</span>' in html
    assert (
        'Waits for a worker of version <span class="mono">v9</span>: none alive.</strong>'
        ' <span>The live workers run <span class="mono">v1</span>'
    ) in html

    Worker.objects.create(name="host-b:2", version="v9", seen_at=timezone.now())
    assert "Waits for a worker" not in client.get(f"/runs/{fork.pk}/").content.decode()


def test_the_compare_page_says_when_parent_and_fork_ran_on_different_versions(
    client_for, people, on_v1, monkeypatch
):
    parent = incident(n_failing=1, n_fine=0)[0]
    deploy_v2(monkeypatch)
    fork = drive(services.fork_run(parent, step=2, at="pre", mode="sandbox", version="v2"))
    assert fork.status == "succeeded"
    html = client_for("viewer").get(f"/runs/{fork.pk}/compare/").content.decode()
    assert (
        '<strong>Different code:</strong> <span>parent ran on <span class="mono">v1</span>,'
        ' fork on <span class="mono">v2</span>.</span>'
    ) in html
    same = services.fork_run(parent, step=2, at="pre", mode="sandbox")
    monkeypatch.setattr("agentrun.engine.versions._SETTLED", ["v1"])
    drive(same)
    assert "Different code" not in (
        client_for("viewer").get(f"/runs/{same.pk}/compare/").content.decode()
    )
