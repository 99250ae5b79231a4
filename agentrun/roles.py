"""Roles: viewer (reads everything), operator (also forks, cancels, approves), admin.

Stored as Django groups of the same names; an admin is also staff and superuser.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

ROLES = ("viewer", "operator", "admin")


def set_role(user: Any, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    groups = [Group.objects.get_or_create(name=name)[0] for name in ROLES]
    user.groups.remove(*groups)
    user.groups.add(Group.objects.get(name=role))
    user.is_staff = user.is_superuser = role == "admin"
    user.save(update_fields=["is_staff", "is_superuser"])


def role_of(user: Any) -> str | None:
    if not getattr(user, "is_authenticated", False):
        return None
    if user.is_superuser:
        return "admin"
    names = set(user.groups.values_list("name", flat=True))
    for role in reversed(ROLES):
        if role in names:
            return role
    return None


def can_view(user: Any) -> bool:
    return role_of(user) is not None


def can_operate(user: Any) -> bool:
    return role_of(user) in ("operator", "admin")


def create_user(name: str, role: str, password: str) -> Any:
    """Create or update a user with this role and password."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=name)
    user.set_password(password)
    user.save()
    set_role(user, role)
    return user
