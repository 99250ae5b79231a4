"""A LangGraph thread in Chromium: its timeline, the tool step's diff, a watch on the
`messages` channel."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from agentrun.integrations.langgraph import run_id_for  # noqa: E402
from tests.debugger.browser import chromium, login, page_for, settle, shot  # noqa: E402
from tests.fake_openai import completion  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser():
    with chromium() as b:
        yield b


def test_a_langgraph_thread_reads_in_the_debugger(ran, people, live_server, browser):
    run_id = run_id_for("order-42")
    with page_for(browser, live_server.url) as (page, seen):
        login(page, people["viewer"].username)
        page.goto(f"/runs/{run_id}/steps/4/")
        settle(page)
        assert page.locator("#strip .cell").count() == 5  # one step per super-step
        assert page.inner_text("#step-body .thought") == "LangGraph loop step 2: tools ran"
        pane = page.locator("#snap-pane")
        pane.get_by_text("order 42: shipped on May 2").first.wait_for()
        assert "tool" in pane.inner_text()
        shot(page, "langgraph-tool-step")

        page.goto(f"/runs/{run_id}/watch/?path=messages")
        settle(page)
        steps = [e.inner_text() for e in page.locator(".watch-entry .watch-step").all()]
        assert steps == ["Step 2", "Step 3", "Step 4", "Step 5"], steps
        shot(page, "langgraph-watch-messages")
        assert seen.unexpected_requests() == []
        assert seen.errors == []


@pytest.mark.worker
def test_a_fork_with_an_edited_message_runs_in_a_worker_and_compares(
    ran_orders, orders_fake, people, live_server, browser, tmp_path, settings
):
    """ "Replay from here" on a LangGraph thread's tool step, with the tool's answer edited
    in the fork form: a worker runs the graph on from the edit, and the compare page
    shows where the fork first differs from its parent."""
    import json

    from agentrun.celery import app as celery_app
    from agentrun.models import Run
    from tests.langgraph.conftest import ORDERS
    from tests.workers import Worker, wait_until

    parent = run_id_for("order-42")
    settings.AGENTRUN_ENQUEUE = True
    celery_app.control.purge()
    orders_fake.push(completion("Order 42 was lost in transit; a new one is on its way."))
    worker = Worker(
        tmp_path, AGENTRUN_LANGGRAPH_GRAPHS=ORDERS, ORDERS_GRAPH_OPENAI_URL=orders_fake.base_url
    )
    try:
        with page_for(browser, live_server.url) as (page, seen):
            login(page, people["operator"].username)
            page.goto(f"/runs/{parent}/steps/4/post/fork/")
            page.click("[data-editor-view=raw]")
            state = json.loads(page.input_value("#fork-state"))
            assert state["messages"][2]["content"] == "order 42: shipped on May 2"
            state["messages"][2]["content"] = "order 42: lost in transit"
            page.fill("#fork-state", json.dumps(state, indent=2))
            page.check("input[name=mode][value=sandbox]")
            page.fill("input[name=reason]", "what if the parcel was lost")
            page.click("[data-action=fork]")
            page.wait_for_selector(".callout.forkinfo")
            fork = Run.objects.get(parent_id=parent)
            wait_until(
                lambda: Run.objects.get(pk=fork.pk).status == "succeeded", timeout=60, what="fork"
            )
            fork.refresh_from_db()
            assert fork.final_answer.startswith("Order 42 was lost in transit")
            assert worker.text().count("execute_step") >= 1  # the worker ran it

            page.goto(f"/runs/{fork.pk}/")
            settle(page)
            assert "Order 42 was lost in transit" in page.inner_text("body")
            shot(page, "langgraph-fork-run")

            page.goto(f"/runs/{fork.pk}/compare/")
            settle(page)
            first = page.locator("tr.first-div, .first-div").first
            first.wait_for()
            text = first.inner_text()
            assert "first divergence" in text.lower()
            assert text.split()[0] == "5"  # the fork's first step: the edited state
            assert "agent ran" in text
            shot(page, "langgraph-fork-compare")
            assert seen.unexpected_requests() == []
            assert seen.errors == []
    finally:
        worker.stop()
