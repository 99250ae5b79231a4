from django.apps import AppConfig


class DebuggerConfig(AppConfig):
    name = "debugger"
