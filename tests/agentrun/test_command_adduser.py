"""`manage.py adduser` refuses names the user model can't hold, and then creates nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db

MAX_LENGTH = get_user_model()._meta.get_field("username").max_length


def adduser(name: str) -> str:
    out = StringIO()
    call_command("adduser", name, "--role", "viewer", "--password", "pw", stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "can't be empty or only spaces"),
        ("   ", "can't be empty or only spaces"),
        ("\t\n", "can't be empty or only spaces"),
        ("nul\x00name", "can't hold control characters (U+0000)"),
        ("bell\x07\x1b[31m", "can't hold control characters (U+0007, U+001B)"),
        ("new\nline", "can't hold control characters (U+000A)"),
        ("zero\u200bwidth", "can't hold control characters (U+200B)"),
        ("two words", "may contain only letters, numbers, and @/./+/-/_ characters"),
        ("x" * (MAX_LENGTH + 1), f"at most {MAX_LENGTH} characters (it has {MAX_LENGTH + 1})"),
        ("x" * 200, f"at most {MAX_LENGTH} characters (it has 200)"),
    ],
)
def test_adduser_refuses_a_bad_name_with_a_clear_error_and_creates_nothing(name, why):
    with pytest.raises(CommandError, match="invalid user name") as raised:
        adduser(name)

    assert why in str(raised.value)
    assert not get_user_model().objects.exists()


def test_a_long_name_is_shown_shortened_in_the_error():
    with pytest.raises(CommandError) as raised:
        adduser("y" * 500)
    assert "'" + "y" * 40 + "…'" in str(raised.value)
    assert "y" * 41 not in str(raised.value)


def test_adduser_accepts_the_longest_name_the_model_holds():
    name = "n" * MAX_LENGTH

    assert adduser(name).strip() == f"created {name} (viewer)"
    assert authenticate(username=name, password="pw") is not None


def test_adduser_stores_a_name_normalised_as_django_does():
    adduser("ｏｌｇａ")  # fullwidth letters: NFKC makes them "olga"

    assert list(get_user_model().objects.values_list("username", flat=True)) == ["olga"]
    assert adduser("olga").strip() == "updated olga (viewer)"
