"""Read results are reused within a run by (tool, args), unless the tool opts out."""

import pytest

from agentrun.models import ToolCall
from agentrun.tools import ToolContext, tool
from tests.base import calls, drive, final, make_run, script

pytestmark = pytest.mark.django_db

COUNTER = {"n": 0}


@tool(kind="read", timeout=0, cache=False, name="test_clock")
def clock(ctx: ToolContext) -> dict:
    """A read whose answer changes: never cached."""
    COUNTER["n"] += 1
    return {"tick": COUNTER["n"]}


def test_a_repeated_read_is_served_from_the_runs_cache():
    run = drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"q": 1}}),
                calls({"tool": "echo", "args": {"q": 1}}),
                final(),
            )
        )
    )
    first, second = ToolCall.objects.filter(run=run).order_by("step__number")
    assert (first.from_cache, second.from_cache) == (False, True)
    assert second.result == first.result


def test_a_read_tool_can_opt_out_of_the_cache():
    COUNTER["n"] = 0
    run = drive(
        make_run(script(calls({"tool": "test_clock"}), calls({"tool": "test_clock"}), final()))
    )
    results = [
        tc.result["tick"] for tc in ToolCall.objects.filter(run=run).order_by("step__number")
    ]
    assert results == [1, 2]
    assert not ToolCall.objects.filter(run=run, from_cache=True).exists()
