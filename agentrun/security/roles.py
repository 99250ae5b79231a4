"""Roles: viewer (reads everything), operator (also forks, cancels, approves), admin.

Stored as Django groups of the same names; an admin is also staff and superuser.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db.models import Field

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


def clean_username(name: str) -> str:
    """The name as it is stored (Unicode-normalised, as Django's own user manager does),
    or ValidationError if the user model would refuse it."""
    User = get_user_model()
    if not name.strip():
        raise ValidationError("a user name can't be empty or only spaces")
    controls = sorted({f"U+{ord(c):04X}" for c in name if unicodedata.category(c).startswith("C")})
    if controls:
        raise ValidationError(f"a user name can't hold control characters ({', '.join(controls)})")
    name = User.normalize_username(name)
    # Django's username validator (letters, digits and @.+-_) and the column's max length:
    # field validators skip empty values, hence the checks above.
    field = User._meta.get_field(User.USERNAME_FIELD)
    assert isinstance(field, Field)
    field.run_validators(name)
    return name


def create_user(name: str, role: str, password: str) -> Any:
    """Create or update a user with this role and password; ValidationError on a bad name."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=clean_username(name))
    user.set_password(password)
    user.save()
    set_role(user, role)
    return user
