"""Short run ids: a unique prefix names a run; a shared or unknown one is a clear error."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agentrun.lifecycle.runids import RunIdError, resolve_run
from agentrun.models import Run
from tests.base import drive, final, make_run, script

pytestmark = pytest.mark.django_db

A = uuid.UUID("3f2a9c1e-1111-4aaa-8bbb-000000000001")
B = uuid.UUID("3f2a9c1e-2222-4aaa-8bbb-000000000002")  # shares 8 characters with A
C = uuid.UUID("7d00beef-0000-4ccc-8ddd-000000000003")


@pytest.fixture
def three():
    return {pk: Run.objects.create(id=pk, agent="scripted") for pk in (A, B, C)}


@pytest.mark.parametrize(
    "text",
    [
        str(C),
        str(C).upper(),
        C.hex,
        "7d00",
        "7d00beef",
        "7D00BEEF",
        " 7d00beef ",
        "7d00beef-00",
        "7d00beef00",  # without the dash
        "7d00-beef",  # a dash in the wrong place is ignored, like any other dash
    ],
)
def test_the_full_id_or_a_unique_prefix_names_the_run(three, text):
    assert resolve_run(text) == three[C]


def test_a_prefix_that_reaches_past_the_first_dash_tells_shared_runs_apart(three):
    assert resolve_run("3f2a9c1e-1") == three[A]
    assert resolve_run("3f2a9c1e2") == three[B]


def test_a_shared_prefix_lists_the_runs_it_could_mean(three):
    with pytest.raises(RunIdError) as refused:
        resolve_run("3f2a9c1e")
    message = str(refused.value)
    assert "matches several runs" in message and "give more characters" in message
    # Each candidate is shown by the prefix that tells it apart from the others.
    assert "3f2a9c1e1" in message and "3f2a9c1e2" in message
    assert set(refused.value.candidates) == {three[A], three[B]}


def test_an_unknown_prefix_says_no_run_has_it(three):
    with pytest.raises(RunIdError, match="no run has an id starting with 'abcd1234'"):
        resolve_run("abcd1234")
    with pytest.raises(RunIdError, match=f"no run {uuid.UUID(int=5)}"):
        resolve_run(str(uuid.UUID(int=5)))


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "is not a valid run id"),
        ("nope", "is not a valid run id"),
        ("3f2a9c1e:4:post", "is not a valid run id"),
        ("%", "is not a valid run id"),
        ("3f2_", "is not a valid run id"),
        ("3f2a9c1e" * 5, "is not a valid run id"),  # longer than an id
        ("3f2", "too short to name a run: give at least 4 characters"),
        ("-3-f-", "too short"),
    ],
)
def test_text_that_is_not_a_run_id_is_refused(three, text, problem):
    with pytest.raises(RunIdError, match=problem):
        resolve_run(text)


def test_a_queryset_narrows_the_runs_looked_at(three):
    with pytest.raises(RunIdError, match="no run has an id"):
        resolve_run("7d00", Run.objects.filter(pk=A))
    assert resolve_run("3f2a", Run.objects.filter(pk=B)) == three[B]


def test_the_prefix_range_takes_neither_neighbour(three):
    below = Run.objects.create(id=uuid.UUID("7cffffff-ffff-4fff-bfff-ffffffffffff"), agent="x")
    above = Run.objects.create(id=uuid.UUID("7d010000-0000-4000-8000-000000000000"), agent="x")
    edge = Run.objects.create(id=uuid.UUID("7d00ffff-ffff-4fff-bfff-ffffffffffff"), agent="x")
    assert resolve_run("7d00ffff") == edge
    assert resolve_run("7cff") == below and resolve_run("7d01") == above
    with pytest.raises(RunIdError, match="matches several runs"):
        resolve_run("7d00")  # C and the edge, not the neighbours


def test_the_fork_command_takes_a_short_id(three):
    parent = drive(make_run(script(final())))
    out = StringIO()
    call_command("fork", parent.pk.hex[:8], "1", "--at", "pre", "--mode", "sandbox", stdout=out)
    fork = Run.objects.get(pk=out.getvalue().strip())
    assert fork.parent == parent
    count = Run.objects.count()
    with pytest.raises(CommandError, match="matches several runs"):
        call_command("fork", "3f2a", "1", "--at", "pre", "--mode", "sandbox", stdout=StringIO())
    with pytest.raises(CommandError, match="no run has an id starting with 'abcd'"):
        call_command("fork", "abcd", "1", "--at", "pre", "--mode", "sandbox", stdout=StringIO())
    assert Run.objects.count() == count
