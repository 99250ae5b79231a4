"""What runs cost, where operators look: each run and step, the run list's total for its
filter (a label's runs), and a batch's forks."""

from __future__ import annotations

import pytest

from agentrun.models import Run, Step
from debugger.formats import usd
from tests.base import drive, make_run

pytestmark = pytest.mark.django_db


def priced(run, tokens_in, tokens_out, cost):
    Run.objects.filter(pk=run.pk).update(tokens_in=tokens_in, tokens_out=tokens_out, cost_usd=cost)
    Step.objects.filter(run=run, number=1).update(tokens_in=tokens_in, tokens_out=tokens_out,
                                                  cost_usd=cost)  # fmt: skip


def test_the_run_list_sums_what_the_filtered_runs_cost(client_for):
    from agentrun.lifecycle import labels

    a, b, c = (drive(make_run()) for _ in range(3))
    for run, label in ((a, "x"), (b, "x"), (c, "y")):
        labels.store(run, {"incident": label})
    priced(a, 1000, 100, 0.25)
    priced(b, 3000, 300, 0.5)
    priced(c, 5000, 500, 9.0)
    html = client_for("viewer").get("/?label=incident=x").content.decode()
    assert "4000 / 400 tokens · $0.75" in html
    assert "$9.00" not in html
    page = client_for("viewer").get(f"/runs/{a.pk}/steps/1/").content.decode()
    assert "1000 in · 100 out · $0.25" in page


@pytest.mark.parametrize(
    "value, shown",
    [(None, "–"), (0, "$0"), (0.00042, "$0.0004"), (1.375, "$1.38"), (12345, "$12,345")],
)
def test_dollars_read_well(value, shown):
    assert usd(value) == shown
