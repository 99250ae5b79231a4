"""A LangGraph checkpoint saver that stores each thread as an agentrun run.

    from agentrun.integrations.langgraph import AgentrunSaver
    graph = builder.compile(checkpointer=AgentrunSaver())

A thread (and each subgraph namespace of it) is a run, each checkpoint a step whose pre
and post snapshots are the channel values before and after the super-step, decoded to
plain JSON for the debugger. The checkpoint itself is kept as LangGraph's serializer wrote
it, so LangGraph reads back exactly what it stored. Needs `pip install agentrun[langgraph]`.

Imported by a LangGraph application that is not a Django process, it sets Django up with
agentrun's settings (DJANGO_SETTINGS_MODULE if set), so the saver writes to agentrun's
database (DATABASE_URL, else the embedded SQLite).
"""

import os

import django
from django.apps import apps
from django.conf import settings

if not settings.configured:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentrun.settings")
if not apps.ready and not apps.loading:
    django.setup()

from agentrun.integrations.langgraph.recorded import recorded_model, recorded_tool  # noqa: E402
from agentrun.integrations.langgraph.saver import AgentrunSaver, run_id_for  # noqa: E402

__all__ = ["AgentrunSaver", "recorded_model", "recorded_tool", "run_id_for"]
