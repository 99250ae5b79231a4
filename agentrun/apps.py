from django.apps import AppConfig


class AgentrunConfig(AppConfig):
    name = "agentrun"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registering the built-in agents and tools is an import side effect.
        # Your own agents and tools: modules that register them on import.
        from importlib import import_module

        from django.conf import settings

        # SQLite's trigger that chains the event log calls these on every connection.
        from django.db.backends.signals import connection_created

        from agentrun import builtin  # noqa: F401
        from agentrun.security import checks  # noqa: F401  (registers the deploy checks)

        connection_created.connect(_register_audit_functions)

        for module in settings.AGENTRUN_AGENT_MODULES:
            import_module(module)
        if settings.AGENTRUN_LANGGRAPH_GRAPHS:
            # The agent that runs LangGraph graphs: their modules are imported when a
            # step first needs one.
            import_module("agentrun.integrations.langgraph.driven")

        # The code version reads the agents' and tools' source now, as this process loaded
        # it: a module edited on disk later does not change what this process runs.
        from agentrun.engine import versions

        versions.settle()

        # The web's /metrics also says what the Now page's header says: runs in flight by
        # state (deciding, on a tool, backoff, approval, in doubt, crashed, stalled, queued).
        from agentrun.engine import inflight
        from agentrun.telemetry import metrics

        metrics.add_counts(
            "agentrun_runs_in_flight",
            "Active runs by what they are doing or waiting for (the Now page's states)",
            "state",
            inflight.counts,
        )


def _register_audit_functions(sender: object, connection: object, **kwargs: object) -> None:
    if getattr(connection, "vendor", "") == "sqlite":
        from agentrun.audit.chain import register_sqlite

        register_sqlite(connection.connection)  # type: ignore[attr-defined]
