from django.apps import AppConfig


class AgentrunConfig(AppConfig):
    name = "agentrun"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registering the built-in agents and tools is an import side effect.
        from agentrun import builtin  # noqa: F401
