"""System checks of a production deployment (`manage.py check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

#: The key an embedded install signs with when SECRET_KEY is not set: a public string.
EMBEDDED_SECRET_KEY = "embedded-insecure-key-set-SECRET_KEY-in-production"  # noqa: S105


@checks.register(checks.Tags.security, deploy=True)
def check_secret_key(**kwargs: Any) -> list[checks.CheckMessage]:
    """Sessions, CSRF tokens and password resets are signed with SECRET_KEY: with the
    embedded default anyone can forge them, so a deployment without its own key fails."""
    if settings.SECRET_KEY != EMBEDDED_SECRET_KEY:
        return []
    return [
        checks.Error(
            "SECRET_KEY is not set: the embedded default key is public, so anyone could "
            "forge sessions and CSRF tokens.",
            hint="Set SECRET_KEY in the environment to a long random value, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(64))'`.",
            id="agentrun.E001",
        )
    ]
