"""Runs the debugger tests look at, built with the scripted agent and driven in-process."""

from __future__ import annotations

from typing import Any

from agentrun.lifecycle import services
from agentrun.models import Run
from tests.base import calls, drive, final, make_run, script

LONG_NOTE = (
    "The customer asked for a refund of order 1042 because the parcel arrived damaged. "
    "Policy allows a refund without a return when the damage is documented with a photo. "
)


def walkthrough_run(
    user: Any, evidence: str = "photo", goal: str = "Refund order 1042 and hold replacement stock"
) -> Run:
    """Eight steps of reads, writes and a hybrid, finishing with an answer."""
    note = LONG_NOTE.replace("photo", evidence)
    return drive(
        make_run(
            script(
                calls(
                    {"tool": "echo", "args": {"lookup": "order 1042", "note": note}},
                    thought="Look up the order",
                ),
                calls(
                    {"tool": "reserve", "args": {"sku": "WIDGET-7", "qty": 2}},
                    thought="Hold replacement stock",
                ),
                calls(
                    {"tool": "ledger_write", "args": {"account": "refunds", "amount": 42.5}},
                    thought="Record the refund",
                ),
                calls(
                    {"tool": "echo", "args": {"check": "ledger balance"}},
                    thought="Check the ledger",
                ),
                calls(
                    {
                        "tool": "notify",
                        "args": {"to": "customer@example.com", "body": "Refund issued"},
                    },
                    thought="Tell the customer",
                ),
                calls(
                    {
                        "tool": "echo",
                        "args": {
                            "lookup": "order 1042",
                            "note": LONG_NOTE.replace("photo", "video"),
                        },
                    },
                    {"tool": "echo", "args": {"summary": "refund 42.50 issued; stock held"}},
                    thought="Re-read the order with the new evidence",
                ),
                calls({"tool": "echo", "args": {"close": "ticket 77"}}, thought="Close the ticket"),
                final("Refunded 42.50 and held two replacement widgets.", thought="All done"),
                goal=goal,
            ),
            user=user,
        )
    )


def failing_run(user: Any) -> Run:
    return drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"q": "inventory"}}, thought="Check inventory"),
                calls(
                    {"tool": "reserve", "args": {"sku": "GADGET-1", "qty": 1}},
                    thought="Reserve a gadget",
                ),
                calls(
                    {"tool": "fail", "args": {"message": "warehouse API returned 503"}},
                    thought="Ship it",
                ),
                goal="Ship a gadget to the customer",
            ),
            user=user,
        )
    )


def waiting_run(user: Any) -> Run:
    """Stops at step 2, waiting for an operator to approve a ledger write."""
    return drive(
        make_run(
            script(
                calls({"tool": "echo", "args": {"q": "invoice 88"}}, thought="Read the invoice"),
                {
                    "thought": "Pay the invoice",
                    "calls": [
                        {
                            "tool": "ledger_write",
                            "args": {"account": "payables", "amount": 1200},
                            "approval": True,
                        }
                    ],
                },
                final("Invoice paid."),
                goal="Pay invoice 88",
            ),
            user=user,
        )
    )


def queued_run(user: Any) -> Run:
    """Never driven: stays queued (active) until someone cancels it."""
    return make_run(
        script(calls({"tool": "echo", "args": {"x": 1}}), final(), goal="A queued job"), user=user
    )


# Untrusted text everywhere it can appear: goal, thoughts, rationale, args, results, errors, answers.
XSS = {
    "script": "<script>alert(1)</script>",
    "img": "<img src=x onerror=alert(1)>",
    "js_link": '<a href="javascript:alert(1)">click me</a>',
    "hx_get": '<div hx-get="/api/runs" hx-trigger="load">poll</div>',
    "hx_on": '<button hx-on:click="alert(1)">press</button>',
    "close_script": '</script><script>alert("json")</script>',
}


def hostile_run(user: Any) -> Run:
    x = XSS
    run = drive(
        make_run(
            script(
                {
                    "thought": x["img"],
                    "rationale": x["js_link"],
                    "calls": [
                        {
                            "tool": "echo",
                            "args": {
                                "html": x["hx_get"],
                                "button": x["hx_on"],
                                "json": x["close_script"],
                                x["script"]: x["img"],
                            },
                        }
                    ],
                },
                {
                    "thought": x["hx_on"],
                    "calls": [
                        {"tool": "notify", "args": {"to": x["js_link"], "body": x["script"]}}
                    ],
                },
                {
                    "thought": x["close_script"],
                    "calls": [{"tool": "echo", "args": {"again": x["hx_get"] + x["img"]}}],
                },
                {
                    "thought": x["script"],
                    "calls": [{"tool": "fail", "args": {"message": x["img"] + x["close_script"]}}],
                },
                goal=x["script"] + x["hx_get"],
            ),
            user=user,
        )
    )
    return run


def hostile_actions(operator: Any) -> Run:
    """An operator action whose reason is hostile text, for the audit page."""
    run = queued_run(operator)
    services.cancel_run(run, user=operator, reason=XSS["img"] + XSS["hx_on"])
    return run
