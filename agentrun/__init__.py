"""agentrun: LLM agents run as durable, step-by-step workflows on Celery.

The runtime, in layers that only point down: `api` and the management commands at the top,
`lifecycle` (what is done to runs), the agents of `builtin` and `examples`, the `engine`
that executes steps, what an agent author imports (`agents`, `tools`, `state`), the `audit`
trail, the `store` of snapshots beside `models`, `security` and `infra` at the bottom. The
Celery app is loaded with the package, so that `shared_task` and `current_app` find it.
"""

from agentrun.celery import app as celery_app

__all__ = ("celery_app",)
