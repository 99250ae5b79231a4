"""The API keeps the contract its OpenAPI document states (schemathesis, against a live server).

Every operation of /api/openapi.json is called with the document's examples (real runs:
one finished, one waiting for approval), its boundary values and generated requests, valid
and invalid, as an operator and as a viewer. No answer may be a 5xx, every status code must
be documented for its operation, every body and content type must match the document, and
every request the document calls invalid must be refused; where the document says all the
server checks, every request it calls valid must be accepted. Seeded (fixed seed,
derandomized) and bounded: about 1,600 requests, 20-30 s.
"""

from __future__ import annotations

import copy

import pytest
import requests
import schemathesis
from django.test import Client
from hypothesis import HealthCheck, settings

from agentrun.models import ApiToken
from tests.base import calls, drive, final, make_people, make_run, script

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 13,
        "generation": {
            "mode": "all",
            "max-examples": 30,
            "deterministic": True,
            "with-security-parameters": False,  # the token is the test's to send
        },
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            "response_headers_conformance": {"enabled": True},
            "negative_data_rejection": {
                "enabled": True,
                "expected-statuses": ["400", "401", "403", "404", "405", "409", "413"],
            },
        },
        "operations": [
            {
                # Where the document says all there is to check, what it calls valid is
                # accepted (or not found, refused to a viewer, not applicable to the run).
                # Not so for a new run's input and a fork's state (their agent validates
                # them), for a fork point (the run must have that snapshot) and for an
                # imported archive (any bytes are a binary body; few are an archive).
                "exclude-operation-id": [
                    "startRun",
                    "forkRun",
                    "getSideEffects",
                    "importRun",
                    # A watched value's path has a grammar the document can't state as a
                    # pattern (keys, indexes, quoted keys, JSON pointers).
                    "getHistory",
                    # A batch needs runs that its filter selects and that have its fork
                    # point; a promotion needs a batch whose forks ended.
                    "createBatch",
                    "promoteBatch",
                ],
                "checks": {
                    "positive_data_acceptance": {
                        "enabled": True,
                        "expected-statuses": ["2xx", "403", "404", "409"],
                    }
                },
            }
        ],
    }
)

#: Steps 1 echo (read); 2 ledger_write (write) + reserve (hybrid); 3 the answer.
SIDE_EFFECTS = script(
    calls({"tool": "echo", "args": {"n": 1}}),
    calls(
        {"tool": "ledger_write", "args": {"account": "acme", "amount": 10}},
        {"tool": "reserve", "args": {"sku": "kayak", "qty": 1}},
    ),
    final("booked"),
)
NEEDS_APPROVAL = script(
    calls({"tool": "ledger_write", "args": {"account": "a", "amount": 1}, "approval": True}),
    final("paid"),
)


#: Stand-ins for the seeded runs' ids in the document's examples (the runs are made per test).
EXAMPLE_RUNS = {
    "00000000-0000-4000-8000-00000000000f": "finished",
    "00000000-0000-4000-8000-00000000000a": "waiting",
}

# Read at collection time, before pytest-django lets "testserver" in.
SERVED = Client().get("/api/openapi.json", SERVER_NAME="localhost").json()


def with_examples(served: dict) -> dict:
    """The document, with the seeded runs as the examples of every run id and a step they
    have as the example of every step."""
    doc = copy.deepcopy(served)
    run_ids = {name: {"value": run_id} for run_id, name in EXAMPLE_RUNS.items()}
    for operation in (op for path in doc["paths"].values() for op in path.values()):
        for param in operation["parameters"]:
            if param["name"] in ("run_id", "run"):
                param["examples"] = run_ids
            elif param["name"] == "step":
                param["example"] = 2
    return doc


# An archive to import is a binary body, sent as it is, like application/octet-stream.
schemathesis.serializer.alias(
    ["application/gzip", "application/x-gzip"], "application/octet-stream"
)

schema = schemathesis.openapi.from_dict(with_examples(SERVED), config=CONFIG)


@pytest.fixture
def tokens():
    people = make_people()
    return {role: ApiToken.issue(people[role]) for role in ("operator", "viewer")}


@pytest.fixture
def runs():
    return {
        "finished": str(drive(make_run(SIDE_EFFECTS)).pk),
        "waiting": str(drive(make_run(NEEDS_APPROVAL)).pk),
    }


def call(case, runs, token, base_url):
    """The case as generated, with the seeded runs in place of their stand-ins."""
    for params in (case.path_parameters, case.query):
        for name, value in (params or {}).items():
            if isinstance(value, str) and value in EXAMPLE_RUNS:
                params[name] = runs[EXAMPLE_RUNS[value]]
    case.call_and_validate(base_url=base_url, headers={"Authorization": f"Bearer {token}"})


@schema.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_an_operator_gets_only_documented_answers(case, runs, tokens, live_server):
    call(case, runs, tokens["operator"], live_server.url)


@schema.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_a_viewer_gets_only_documented_answers(case, runs, tokens, live_server):
    call(case, runs, tokens["viewer"], live_server.url)


def test_the_live_server_serves_the_document_tested(live_server):
    assert requests.get(f"{live_server.url}/api/openapi.json", timeout=10).json() == SERVED
