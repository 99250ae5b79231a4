"""agentrun's management commands, in `commands`: one module a `manage.py` command."""
