"""The run list filters with agentrun.lifecycle.selection: the text of the error, the code
version, a tool whose call failed; the page, the API and batches select the same runs."""

from __future__ import annotations

import pytest

from agentrun.lifecycle import selection
from agentrun.models import Run
from tests.debugger import runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def three(people):
    olga = people["operator"]
    done = runs.walkthrough_run(olga)
    failed = runs.failing_run(olga)
    queued = runs.queued_run(olga)
    Run.objects.filter(pk=done.pk).update(code_version="v1")
    Run.objects.filter(pk=failed.pk).update(code_version="v2")
    return done, failed, queued


def ids(response) -> set[str]:
    return {str(run.pk) for run in response.context["page"]}


def test_it_filters_by_the_text_of_the_error(client_for, three):
    done, failed, queued = three
    client = client_for("viewer")
    assert ids(client.get("/?error=warehouse API")) == {str(failed.pk)}
    assert ids(client.get("/?error=503")) == {str(failed.pk)}
    assert ids(client.get("/?error=no such error")) == set()


def test_it_filters_by_the_version_that_ran_the_latest_step(client_for, three):
    done, failed, queued = three
    client = client_for("viewer")
    assert ids(client.get("/?version=v1")) == {str(done.pk)}
    assert ids(client.get("/?version=v2&status=failed")) == {str(failed.pk)}


def test_it_filters_by_a_tool_whose_call_failed(client_for, three):
    done, failed, queued = three
    client = client_for("viewer")
    assert ids(client.get("/?tool_failed=fail")) == {str(failed.pk)}
    assert ids(client.get("/?tool_failed=echo")) == set()  # echo was called, and did not fail


def test_a_bad_version_is_refused_next_to_its_field_and_lists_nothing(client_for, three):
    response = client_for("viewer").get("/?version=no spaces allowed")
    assert response.context["page"].paginator.count == 0
    assert "version" in response.context["form"].errors
    assert "Version: a version is letters, digits" in response.content.decode()


def test_the_page_selects_what_the_shared_definition_selects(client_for, three):
    query = {"status": "failed", "error": "503", "tool_failed": "fail", "version": "v2"}
    response = client_for("viewer").get("/", query)
    shared = selection.parse(query).apply(Run.objects.all())
    assert ids(response) == {str(pk) for pk in shared.values_list("pk", flat=True)} != set()
    assert response.context["form"].query() == query
