"""The Now page lists the live workers with the code version each runs, and the active runs
that wait for a worker: they ask for a version no live worker runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentrun.lifecycle import services
from agentrun.models import Worker
from tests.debugger.conftest import hx
from tests.fleet.scenario import incident

pytestmark = pytest.mark.django_db


def test_it_lists_the_live_workers_with_their_versions(client_for, people):
    now = timezone.now()
    Worker.objects.create(name="host-a:101", version="v1", seen_at=now)
    Worker.objects.create(name="host-b:202", version="v2", seen_at=now)
    Worker.objects.create(name="gone:9", version="v0", seen_at=now - timedelta(hours=1))
    response = client_for("viewer").get("/now/")
    assert [w.name for w in response.context["workers"]] == ["host-a:101", "host-b:202"]
    html = response.content.decode()
    assert 'Workers <span class="count">2</span>' in html
    assert '<a href="?worker=host-b%3A202" title="what this worker holds">host-b:202</a>' in html
    assert '<span class="mono ver" title="v2">v2</span>' in html
    assert "gone:9" not in html


def test_it_lists_the_runs_waiting_for_a_worker_of_their_version(client_for, people, on_v1):
    parent = incident(n_failing=1, n_fine=0)[0]
    waits = services.fork_run(parent, step=2, at="pre", mode="sandbox", version="v2")
    served = services.fork_run(parent, step=2, at="pre", mode="sandbox", version="v1")
    anyone = services.fork_run(parent, step=2, at="pre", mode="sandbox")
    Worker.objects.create(name="host-a:101", version="v1", seen_at=timezone.now())
    client = client_for("viewer")
    response = client.get("/now/")
    assert [r.pk for r in response.context["waiting"]] == [waits.pk]
    html = response.content.decode()
    assert 'Waiting for a worker <span class="count">1</span>' in html
    assert f'href="/runs/{waits.pk}/"' in html
    assert str(served.pk)[:8] not in html.split("waiting-for-a-worker")[1].split("</section>")[0]
    assert anyone.target_version == ""

    # The page's polled body has them too; a worker of v2 arrives and the run no longer waits.
    Worker.objects.create(name="host-c:303", version="v2", seen_at=timezone.now())
    body = client.get("/now/", **hx("now-body")).content.decode()
    assert "Waiting for a worker" not in body and "host-c:303" in body
