"""Run labels: given at the start (API, startrun --label), shown and filtered on in the API,
inherited by forks; bad labels are refused with a reason and nothing is stored. Also the
run's input in GET /api/runs/{id}, redacted."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agentrun.lifecycle import labels, services
from agentrun.models import Event, Run, RunLabel, Snapshot
from agentrun.security.redact import REDACTED
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db

INPUT = script(calls({"tool": "echo", "args": {"q": 1}}), final("ok"), goal="restock tents")


@pytest.fixture
def people():
    return make_people()


@pytest.fixture
def client(people):
    client = Client()
    client.force_login(people["operator"])
    return client


def post_run(client, **body):
    return client.post(
        "/api/runs", {"agent": "scripted", "input": INPUT, **body}, content_type="application/json"
    )


def stored() -> tuple[int, int, int, int]:
    return (
        Run.objects.count(),
        RunLabel.objects.count(),
        Event.objects.count(),
        Snapshot.objects.count(),
    )


# --- the API -------------------------------------------------------------------------------


def test_labels_given_at_the_start_come_back_in_the_summary_the_detail_and_the_list(client):
    response = post_run(client, labels={"story": "stale-cart", "team": "shop/checkout"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["labels"] == {"story": "stale-cart", "team": "shop/checkout"}
    run = Run.objects.get(pk=body["id"])
    assert dict(run.labels.values_list("key", "value")) == body["labels"]
    assert client.get(f"/api/runs/{run.pk}").json()["labels"] == body["labels"]
    [item] = client.get("/api/runs").json()["items"]
    assert item["labels"] == body["labels"]


def test_a_run_started_without_labels_has_none(client):
    body = post_run(client).json()
    assert body["labels"] == {}
    assert not RunLabel.objects.exists()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"bad key": "x"}, "label key 'bad key' is not allowed"),
        ({"-lead": "x"}, "label key '-lead' is not allowed"),
        ({"k" * 64: "x"}, "is 64 characters long; the limit is 63"),
        ({"story": ""}, "label story: the value is empty"),
        ({"story": "v" * 201}, "the value is 201 characters long; the limit is 200"),
        ({"story": "two\nlines"}, "has a control character"),
        ({"story": " padded"}, "a space at either end"),
        ({"story": 7}, "label story: the value must be a string"),
        ({f"k{i}": "v" for i in range(21)}, "21 labels; a run has at most 20"),
        ({"forked-from": "abc"}, "label key 'forked-from' is reserved"),
        (["story=x"], "labels must be a JSON object"),
    ],
)
def test_bad_labels_are_refused_with_a_reason_and_nothing_is_stored(client, bad, message):
    before = stored()

    response = post_run(client, labels=bad)

    assert response.status_code == 400, response.content
    assert message in response.json()["detail"]
    assert response.json()["field"] == "labels"
    assert stored() == before


def test_the_list_filters_on_labels_by_key_and_value_or_key_alone(client):
    stale = post_run(client, labels={"story": "stale-cart", "team": "shop"}).json()["id"]
    other = post_run(client, labels={"story": "happy-path", "team": "shop"}).json()["id"]
    bare = post_run(client).json()["id"]

    def ids(query):
        body = client.get(f"/api/runs{query}").json()
        assert body["count"] == len(body["items"])
        return {item["id"] for item in body["items"]}

    assert ids("?label=story=stale-cart") == {stale}
    assert ids("?label=story") == {stale, other}
    assert ids("?label=team=shop&label=story=happy-path") == {other}
    assert ids("?label=team=nobody") == set()
    assert ids("") == {stale, other, bare}


@pytest.mark.parametrize("bad", ["", "bad key=x", "story= x", "k=" + "v" * 201])
def test_a_bad_label_filter_is_a_400(client, bad):
    response = client.get("/api/runs", {"label": bad})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "label"


def test_the_openapi_document_states_the_label_rules(client):
    doc = client.get("/api/openapi.json").json()
    schemas = doc["components"]["schemas"]
    create = schemas["CreateRun"]["properties"]["labels"]
    assert create["maxProperties"] == labels.MAX_LABELS
    assert create["propertyNames"]["pattern"] == labels.KEY_PATTERN
    assert create["additionalProperties"]["maxLength"] == labels.VALUE_MAX_LENGTH
    assert "labels" in schemas["RunSummary"]["required"]
    assert "input" in schemas["RunDetail"]["required"]
    assert "redacted" in schemas["RunDetail"]["properties"]["input"]["description"]
    [param] = [p for p in doc["paths"]["/api/runs"]["get"]["parameters"] if p["name"] == "label"]
    assert param["schema"]["type"] == "array"


# --- forks ---------------------------------------------------------------------------------


def test_a_fork_inherits_its_parents_labels_and_names_its_parent(people):
    parent = drive(
        services.start_run(
            "scripted", INPUT, user=people["operator"], labels={"story": "stale-cart"}
        )
    )

    fork = services.fork_run(parent, step=2, at="pre", user=people["operator"])
    grandchild = services.fork_run(
        drive(fork), step=2, at="pre", user=people["operator"], labels={"fix": "retry"}
    )

    assert labels.of(fork) == {"story": "stale-cart", "forked-from": str(parent.pk)[:8]}
    assert labels.of(grandchild) == {
        "story": "stale-cart",
        "fix": "retry",
        "forked-from": str(fork.pk)[:8],
    }
    assert labels.of(parent) == {"story": "stale-cart"}


def test_a_fork_with_bad_labels_is_refused_and_nothing_is_stored(people):
    parent = drive(services.start_run("scripted", INPUT, labels={"story": "x"}))
    before = stored()

    with pytest.raises(services.ForkError, match="the value is empty") as refused:
        services.fork_run(parent, step=2, at="pre", labels={"fix": ""})

    assert refused.value.field == "labels"
    assert stored() == before


def test_the_api_fork_answers_with_the_inherited_labels(client):
    run_id = post_run(client, labels={"story": "stale-cart"}).json()["id"]
    drive(Run.objects.get(pk=run_id))

    response = client.post(
        f"/api/runs/{run_id}/fork", {"step": 2, "at": "pre"}, content_type="application/json"
    )

    assert response.status_code == 201, response.content
    assert response.json()["labels"] == {"story": "stale-cart", "forked-from": run_id[:8]}


def test_the_api_fork_takes_labels_of_its_own_and_refuses_bad_ones(client):
    run_id = post_run(client, labels={"story": "stale-cart"}).json()["id"]
    drive(Run.objects.get(pk=run_id))

    def fork(labels):
        return client.post(
            f"/api/runs/{run_id}/fork",
            {"step": 2, "at": "pre", "labels": labels},
            content_type="application/json",
        )

    before = stored()
    for bad, message in (
        ({"forked-from": "x"}, "reserved"),
        ({"fix": " x"}, "a space at either end"),
        ({f"k{i}": "v" for i in range(20)}, "the fork would have 21 labels"),
    ):
        refused = fork(bad)
        assert refused.status_code == 400, refused.content
        assert message in refused.json()["detail"] and refused.json()["field"] == "labels"
    assert stored() == before

    made = fork({"fix": "cart-corrected"})
    assert made.status_code == 201, made.content
    assert made.json()["labels"] == {
        "story": "stale-cart",
        "fix": "cart-corrected",
        "forked-from": run_id[:8],
    }


# --- the run's input in the API ------------------------------------------------------------


def test_the_detail_shows_the_runs_input(client):
    run_id = post_run(client).json()["id"]
    assert client.get(f"/api/runs/{run_id}").json()["input"] == INPUT


def test_the_detail_shows_the_input_redacted(client):
    secret_input = {**INPUT, "api_key": "sk-live-0123456789abcdefghij", "note": "Bearer abc.def"}
    run_id = post_run(client).json()["id"]
    # As a row written before redaction on the way in (or by hand) would hold it.
    Run.objects.filter(pk=run_id).update(input=secret_input)

    shown = client.get(f"/api/runs/{run_id}").json()["input"]

    assert shown["api_key"] == REDACTED
    assert shown["note"] == f"Bearer {REDACTED}"
    assert shown["goal"] == "restock tents"
    assert "sk-live" not in json.dumps(client.get("/api/runs").json())  # not in summaries


# --- the command line ----------------------------------------------------------------------


def startrun(*args: str) -> str:
    out = StringIO()
    call_command("startrun", "scripted", "--input", json.dumps(INPUT), *args, stdout=out)
    return out.getvalue().strip()


def test_startrun_takes_repeated_labels():
    run_id = startrun("--label", "story=stale-cart", "--label", "ticket=INC-7=b")

    assert labels.of(Run.objects.get(pk=run_id)) == {"story": "stale-cart", "ticket": "INC-7=b"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label", "story"], "label 'story' has no '='"),
        (["--label", "story=a", "--label", "story=b"], "label story is given twice"),
        (["--label", "a b=c"], "label key 'a b' is not allowed"),
        (["--label", "story="], "the value is empty"),
        ([arg for i in range(21) for arg in ("--label", f"k{i}=v")], "21 labels"),
    ],
)
def test_startrun_refuses_bad_labels_and_stores_nothing(args, message):
    before = stored()

    with pytest.raises(CommandError, match=f"--label: .*{message}"):
        startrun(*args)

    assert stored() == before


def test_labels_are_checked_before_the_agent_or_the_input():
    """One call, one answer: with bad labels and a bad input, nothing at all is written."""
    before = stored()
    with pytest.raises(labels.InvalidLabels):
        services.start_run("nobody", {"x": 1}, labels={"": "x"})
    assert stored() == before
    make_run()  # and a good start still works
    assert Run.objects.count() == before[0] + 1


@pytest.mark.django_db
def test_a_bare_word_in_the_label_filter_matches_a_key_or_a_value():
    from agentrun.lifecycle import labels, services
    from agentrun.models import Run
    from tests.base import calls, final, script

    steps = script(calls({"tool": "echo", "args": {}}), final())
    stale = services.start_run("scripted", steps, labels={"problem": "stale-cart"})
    keyed = services.start_run("scripted", steps, labels={"stale-cart": "yes"})
    services.start_run("scripted", steps, labels={"problem": "other"})
    found = set(labels.filter_runs(Run.objects.all(), ["stale-cart"]).values_list("pk", flat=True))
    assert found == {stale.pk, keyed.pk}
    exact = labels.filter_runs(Run.objects.all(), ["problem=stale-cart"])
    assert list(exact.values_list("pk", flat=True)) == [stale.pk]


@pytest.mark.django_db
def test_the_run_lists_text_search_matches_label_keys_and_values():
    from agentrun.lifecycle import selection, services
    from agentrun.models import Run
    from tests.base import calls, final, script

    steps = script(calls({"tool": "echo", "args": {}}), final())
    stale = services.start_run("scripted", steps, labels={"problem": "stale-cart"})
    services.start_run("scripted", steps, labels={"problem": "other"})
    found = selection.parse({"q": "stale"}).apply(Run.objects.all())
    assert list(found.values_list("pk", flat=True)) == [stale.pk]
