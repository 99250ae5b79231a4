"""`manage.py dbroles --app-role NAME [--password-env VAR] [--print]`: the app's database role."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentrun.audit import dbroles


class Command(BaseCommand):
    help = (
        "Create or update a PostgreSQL role for the web and worker processes that owns no "
        "table: it reads and writes the app's tables but only appends to the event log. "
        "Run it as the owner of the tables (the role that runs migrate), after every migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--app-role", required=True, help="the role the app connects as")
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            help="set the role's password from this environment variable",
        )
        parser.add_argument(
            "--print",
            action="store_true",
            help="print the SQL instead of running it (the password is not shown)",
        )

    def handle(self, *args: Any, app_role: str, password_env: str | None, **options: Any) -> None:
        password = None
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"--password-env: ${password_env} is empty or not set")
        try:
            plan = dbroles.plan_app_role(app_role)
        except dbroles.RoleError as exc:
            raise CommandError(str(exc)) from None
        if options["print"]:
            for statement in dbroles.role_statements(plan, None) + plan.statements:
                self.stdout.write(dbroles.as_text(statement) + ";")
            if password is not None:
                self.stdout.write(f"-- and its password, from ${password_env} (not shown)")
            return
        dbroles.apply(plan, password)
        self.stdout.write(
            f"{'updated' if plan.exists else 'created'} role {app_role}: reads and writes the "
            f"app's tables, only appends to {dbroles.EVENTS}; {plan.owner} still owns them"
        )
