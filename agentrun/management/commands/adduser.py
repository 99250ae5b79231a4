"""`manage.py adduser NAME --role viewer|operator|admin --password PW`: create or update a user."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.security.roles import ROLES, clean_username, create_user


class Command(BaseCommand):
    help = "Create a user with a role, or update an existing user's role and password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--password", required=True)

    def handle(self, *args: Any, name: str, role: str, password: str, **options: Any) -> None:
        try:
            name = clean_username(name)
        except ValidationError as exc:
            shown = name if len(name) <= 40 else name[:40] + "…"
            raise CommandError(f"invalid user name {shown!r}: {' '.join(exc.messages)}") from None
        existed = get_user_model().objects.filter(username=name).exists()
        create_user(name, role, password)
        self.stdout.write(f"{'updated' if existed else 'created'} {name} ({role})")
