"""`manage.py demo`: idempotent, and every story ends as it says.

Slow-ish (~15 s on SQLite): it plays every story, including a child process
that really dies mid-step and a lease that must expire. The database is
committed for real (transaction=True) because that child reads and writes it.
"""

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from agentrun.lifecycle import labels
from agentrun.management.commands.demo import FIX_REASON, STORIES
from agentrun.models import (
    Event,
    LedgerEntry,
    LedgerInvocation,
    Reservation,
    Run,
    RunLabel,
    Step,
    ToolCall,
)
from agentrun.security.roles import role_of
from agentrun.store import snapshots

pytestmark = pytest.mark.django_db(transaction=True)


def demo() -> str:
    out = StringIO()
    call_command("demo", stdout=out)
    return out.getvalue()


def story_run(label: str) -> Run:
    run = next(s for s in STORIES if s.label == label).find()
    assert run is not None, f"no demo run {label}"
    return run


def test_the_demo_is_idempotent_and_its_runs_end_as_their_stories_say():
    first = demo()
    runs, users = Run.objects.count(), get_user_model().objects.count()
    RunLabel.objects.all().delete()  # as if made by a demo from before runs had labels
    second = demo()

    # Every story, plus the operator's fix for the incident (a fork).
    assert Run.objects.count() == runs == len(STORIES) + 1
    assert get_user_model().objects.count() == users
    assert " new " in first and " new " not in second
    for name in ("admin", "operator", "viewer"):
        user = get_user_model().objects.get(username=name)
        assert user.check_password("demo") and role_of(user) == name
        assert f"{name} / demo  ({name})" in second
    assert {
        s.label: (story_run(s.label).status, story_run(s.label).wait_reason) for s in STORIES
    } == {
        "happy-path": ("succeeded", ""),
        "incident": ("succeeded", ""),
        "flaky-shipping": ("succeeded", ""),
        "worker-crash": ("succeeded", ""),
        "awaiting-approval": ("waiting", "approval"),
        "card-declined": ("failed", ""),
        "scripted-short": ("succeeded", ""),
        "scripted-12": ("succeeded", ""),
    }
    for run in Run.objects.all():
        assert str(run.pk) in second
    assert_the_stories_show_what_they_claim()
    assert_the_incident_is_fixed_by_a_fork()
    assert_every_run_is_labelled_with_its_story()


def assert_every_run_is_labelled_with_its_story() -> None:
    for story in STORIES:
        found = labels.of(story_run(story.label))
        assert found["source"] == "demo" and found["story"] == story.label, found
    assert labels.of(story_run("incident")) == {
        "source": "demo",
        "story": "incident",
        "customer": "ben",
        "problem": "stale-cart",
        "cart-change": "STOVE-1-removed-after-step-2",
    }
    assert labels.of(story_run("card-declined"))["fault"] == "card-declined"
    fix = Run.objects.get(parent=story_run("incident"))
    assert labels.of(fix) == {
        **labels.of(story_run("incident")),
        "fix": "cart-corrected",
        "forked-from": str(story_run("incident").pk)[:8],
    }
    # Two runs of the same story are one filter away.
    incident_runs = labels.filter_runs(Run.objects.all(), ["story=incident"])
    assert set(incident_runs) == {story_run("incident"), fix}


def assert_the_stories_show_what_they_claim() -> None:
    incident = story_run("incident")
    assert (
        "because the cart has Backpacking stove (STOVE-1)"
        in Step.objects.get(run=incident, number=4).thought
    )

    quote = ToolCall.objects.get(run=story_run("flaky-shipping"), tool="shipping_quote")
    assert quote.step.number == 6
    assert [bool(a.get("error")) for a in quote.attempts] == [True, True, False]

    crashed = story_run("worker-crash")
    order = ToolCall.objects.get(run=crashed, tool="place_order")
    assert order.step.number == 8 and order.step.attempts == 2
    assert order.attempts[0].get("fault") == "crash_after" and "ended" not in order.attempts[0]
    # The order was placed by the worker that died, and not placed again on resume.
    assert LedgerInvocation.objects.get(idempotency_key=order.idempotency_key).count == 2
    for key in ToolCall.objects.filter(run=crashed, kind="write").values_list(
        "idempotency_key", flat=True
    ):
        assert LedgerEntry.objects.filter(idempotency_key=key).count() <= 1
    assert LedgerEntry.objects.filter(run=crashed).count() == 2

    waiting = story_run("awaiting-approval")
    assert waiting.next_step == 7
    assert ToolCall.objects.get(run=waiting, tool="charge_payment").status == "awaiting_approval"

    declined = story_run("card-declined")
    assert all(Reservation.objects.filter(run=declined).values_list("released", flat=True))

    assert story_run("scripted-12").steps_done == 12


def assert_the_incident_is_fixed_by_a_fork() -> None:
    incident = story_run("incident")
    fix = Run.objects.get(parent=incident)
    assert (fix.mode, fix.status, fix.first_step) == ("sandbox", "succeeded", 3)
    assert (fix.forked_from.step, fix.forked_from.at) == (3, "pre")
    forked = Event.objects.get(run=fix, kind="run_forked")
    assert (forked.actor, forked.reason) == ("operator", FIX_REASON)
    assert [path for _, path, *_ in forked.payload["edits"]] == [["memory", "notes", "cart"]]
    # It recommends for the tent, which is really in the cart, not for the removed stove.
    assert Step.objects.get(run=fix, number=3).decision["calls"][0]["args"] == {"skus": ["TENT-2P"]}
    notes = snapshots.load(fix.pk, 3, "post")["memory"]["notes"]
    assert json.loads(notes["recommendation"])["for_sku"] == "TENT-2P"
    assert Step.objects.get(run=fix, number=4).thought.startswith(
        "Recommending Aluminium tent stakes, pack of 8 (STAKES-AL) "
        "because the cart has Two-person tent (TENT-2P)."
    )
    assert "STOVE-1" not in fix.final_answer and "tent stakes" in fix.final_answer
    # Sandbox: nothing was reserved, charged, ordered or e-mailed for the fix.
    calls = ToolCall.objects.filter(run=fix, kind__in=("write", "hybrid"))
    assert calls.exists() and set(calls.values_list("status", flat=True)) == {"skipped"}
    assert not Reservation.objects.filter(run=fix).exists()
    assert not LedgerEntry.objects.filter(run=fix).exists()
