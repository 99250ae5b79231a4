"""`manage.py apitoken NAME`: issue a new API token for a user and print it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.models import ApiToken


class Command(BaseCommand):
    help = "Print a new API token for NAME (use it as `Authorization: Bearer <token>`)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=name).first()
        if user is None:
            raise CommandError(f"no user named {name!r}; create one with `manage.py adduser`")
        # Only its hash is stored: this is the one time it can be seen.
        self.stdout.write(ApiToken.issue(user))
