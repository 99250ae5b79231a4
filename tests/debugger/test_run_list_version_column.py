"""The run list's version column: the version that ran a run's latest step, a link that
filters the list by it; a fork that asks for a version shows asked → ran."""

from __future__ import annotations

import pytest

from agentrun.models import Run
from tests.debugger import runs

pytestmark = pytest.mark.django_db


def test_each_run_shows_its_version_and_a_fork_that_asks_for_one_shows_asked_and_ran(
    client_for, people
):
    plain = runs.walkthrough_run(people["operator"])
    fork = runs.failing_run(people["operator"])
    waiting = runs.queued_run(people["operator"])
    Run.objects.filter(pk=plain.pk).update(code_version="v1")
    Run.objects.filter(pk=fork.pk).update(target_version="v2", code_version="v2")
    Run.objects.filter(pk=waiting.pk).update(target_version="v3", code_version="")
    html = client_for("viewer").get("/").content.decode()
    assert "<th>Version</th>" in html
    assert 'href="?version=v1"' in html  # the version filters the list
    assert ">v2 → v2</span>" in html
    assert ">v3 → …</span>" in html
