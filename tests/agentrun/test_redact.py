"""Tests for agentrun.security.redact: secret keys, secrets inside strings, sharing."""

import copy
import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.security.redact import REDACTED, is_secret_key, redact, redact_text

OPENAI_KEY = "sk-" + "A1b2C3d4E5f6G7h8J9k0"
OPENAI_PROJECT_KEY = "sk-proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq9\nq0wzTQ==\n-----END RSA PRIVATE KEY-----"
)


# ---------------------------------------------------------------------------
# Which keys are secret
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "apikey",
        "api-key",
        "API_KEY",
        "Authorization",
        "password",
        "passwd",
        "token",
        "access_token",
        "secret",
        "client_secret",
        "private_key",
        "cookie",
        "x-api-key",
        "X-Api-Key",
        "OPENAI_API_KEY",
        "openai-apikey",
        "github_token",
        "refresh_token",
        "db_password",
        "Proxy-Authorization",
        "Set-Cookie",
        "secret_key",
        "aws_secret_access_key",
        "accessToken",
        "clientSecret",
        "APIKey",
        "password_hash",
    ],
)
def test_keys_naming_a_secret_are_secret(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "token_count",
        "maxTokens",
        "prompt_tokens",
        "tokens",
        "tokenizer_name",
        "tokenizer",
        "password_policy",
        "token_url",
        "token_type",
        "cookie_name",
        "api_key_env",
        "has_password",
        "secretary",
        "keyboard",
        "key",
        "author",
        "passage",
        "content",
        "",
    ],
)
def test_look_alike_keys_are_not_secret(key):
    assert not is_secret_key(key)


def test_non_string_keys_are_not_secret():
    assert not is_secret_key(3)


# ---------------------------------------------------------------------------
# Structures
# ---------------------------------------------------------------------------


def test_values_of_secret_keys_are_replaced_wholly_at_any_depth():
    value = {
        "model": "gpt",
        "max_tokens": 512,
        "headers": {"Authorization": "Bearer abc", "X-API-KEY": "k", "Accept": "json"},
        "auth": {"password": 1234, "user": "bob", "token": {"value": "t", "exp": 1}},
        "items": [{"client_secret": ["a", "b"]}, {"name": "x"}],
    }
    assert redact(value) == {
        "model": "gpt",
        "max_tokens": 512,
        "headers": {"Authorization": REDACTED, "X-API-KEY": REDACTED, "Accept": "json"},
        "auth": {"password": REDACTED, "user": "bob", "token": REDACTED},
        "items": [{"client_secret": REDACTED}, {"name": "x"}],
    }


def test_empty_and_boolean_secret_values_are_kept_because_they_hide_nothing():
    value = {"token": None, "password": "", "api_key": False, "cookie": True}
    assert redact(value) == value


def test_secrets_inside_strings_in_lists_and_tuples_are_redacted():
    value = ["plain", f"key {OPENAI_KEY}", (AWS_KEY_ID, 3), [[GITHUB_TOKEN]]]
    assert redact(value) == ["plain", f"key {REDACTED}", (REDACTED, 3), [[REDACTED]]]


def test_tool_call_arguments_holding_json_are_redacted_inside_the_string():
    message = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "function": {
                    "name": "login",
                    "arguments": json.dumps({"user": "bob", "password": "hunter2"}),
                },
            }
        ],
    }
    arguments = redact(message)["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"user": "bob", "password": REDACTED}


def test_redact_does_not_mutate_its_input():
    value = {"a": [{"password": "p"}, f"x {OPENAI_KEY}"], "token": "t"}
    before = copy.deepcopy(value)
    redact(value)
    assert value == before


def test_unchanged_subtrees_are_shared_not_copied():
    clean = {"role": "user", "content": "hello"}
    dirty = {"role": "user", "content": f"my key is {OPENAI_KEY}"}
    history = [clean, dirty]
    value = {"history": history, "memory": {"notes": {"a": "b"}}, "n": 1}
    out = redact(value)
    assert out is not value
    assert out["history"][0] is clean
    assert out["history"][1] is not dirty
    assert out["memory"] is value["memory"]


def test_a_value_without_secrets_is_returned_as_the_same_object():
    value = {"a": [1, 2.5, None, True, "text"], "b": {"max_tokens": 3}}
    assert redact(value) is value
    text = "nothing to see here"
    assert redact_text(text) is text


def test_scalars_pass_through():
    assert [redact(v) for v in (None, 1, 2.5, True)] == [None, 1, 2.5, True]


# ---------------------------------------------------------------------------
# Strings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"export KEY {OPENAI_KEY} now", f"export KEY {REDACTED} now"),
        (f"project key {OPENAI_PROJECT_KEY}.", f"project key {REDACTED}."),
        (f"id={AWS_KEY_ID}", f"id={REDACTED}"),
        (f"aws {AWS_KEY_ID} here", f"aws {REDACTED} here"),
        (f"gh {GITHUB_TOKEN}", f"gh {REDACTED}"),
        ("curl -H 'x: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig'", f"curl -H 'x: Bearer {REDACTED}'"),
        ("sent bearer abcd1234efgh", f"sent bearer {REDACTED}"),
        (f"before\n{PEM}\nafter", f"before\n{REDACTED}\nafter"),
        ("-----BEGIN PRIVATE KEY-----\nMIIEv (log cut off", REDACTED),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {REDACTED}"),
        ("  password: hunter2  \nuser: bob", f"  password: {REDACTED}  \nuser: bob"),
        (
            "GET /cb?code=1&access_token=abc123&page=2",
            f"GET /cb?code=1&access_token={REDACTED}&page=2",
        ),
        ("OPENAI_API_KEY=abc\nDEBUG=1", f"OPENAI_API_KEY={REDACTED}\nDEBUG=1"),
        ("login(user='bob', password='pw')", f"login(user='bob', password='{REDACTED}')"),
        ("{'api_key': 'abc', 'n': 1}", f"{{'api_key': '{REDACTED}', 'n': 1}}"),
        ('{"token": 12345}', f'{{"token": "{REDACTED}"}}'),
        ('{\\"password\\": \\"pw\\"}', f'{{\\"password\\": \\"{REDACTED}\\"}}'),
    ],
)
def test_secrets_inside_text_are_redacted(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "sk-short",
        "task-abcdefghijklmnopqrstuvwxyz",
        "risk-assessment-for-large-projects",
        "AKIA123",
        "akiaiosfodnn7example",
        "the Bearer of bad news",
        "ghp_short",
        "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
        "max_tokens=512, token_count: 3",
        '{"max_tokens": 100, "tokenizer_name": "cl100k"}',
        "token == expected",
        '{"token": null, "password": ""}',
        "we discussed the password policy",
        f"already {REDACTED}",
    ],
)
def test_look_alikes_in_text_are_left_alone(text):
    assert redact_text(text) == text


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["password", "token", "max_tokens", "name", "api_key", "notes"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=200)
@given(json_values)
def test_redaction_is_idempotent(value):
    once = redact(value)
    assert redact(once) == once


words = st.text(alphabet="abcdefghij XYZ0123456789", max_size=20)
flat_values = st.none() | st.booleans() | st.integers() | words


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["password", "api_key", "max_tokens", "token_count", "name", "note"]),
        flat_values,
        max_size=6,
    )
)
def test_redacting_json_text_matches_redacting_the_parsed_object(obj):
    assert json.loads(redact_text(json.dumps(obj))) == redact(obj)


@pytest.mark.parametrize(
    "text",
    ["x=" * 50_000, '"k": ' * 30_000, "a token=x " * 20_000, '"token": "' * 30_000],
)
def test_pair_redaction_stays_linear_on_adversarial_text(text):
    # A quadratic scan takes tens of seconds on these; a linear one milliseconds.
    started = time.perf_counter()
    redact_text(text)
    assert time.perf_counter() - started < 5


PREFIXES = ("sk-", "sk-proj-", "AKIA", "gh", "ghp_", "gho_", "ghx_", "github_", "github_pat_")
# Pieces that make texts near every token pattern: prefixes, tokens cut short, the
# characters the lookbehinds look at.
_PIECES = st.sampled_from(
    [*PREFIXES, "g", "h", "_", "-", " ", "x", "Q", "7", "call_12", "through"]
    + [OPENAI_KEY, AWS_KEY_ID, GITHUB_TOKEN, "a1B2c3D4e5F6g7H8i9J0"]
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_texts_with_an_underscore_but_no_github_prefix_skip_the_token_scan_only(
    text: str,
) -> None:
    # redact_text scans a text with an underscore for tokens only when it holds the start
    # of a GitHub token (most such text is identifiers, "call_12"): the same text out as
    # when every text with an underscore is scanned.
    from agentrun.security import redact as r

    out = redact_text(text)
    if r._TOKENS.search(text):
        assert out != text
    scan_all = re.compile("")  # (matches every text)
    original, r._GITHUB_PREFIX = r._GITHUB_PREFIX, scan_all
    try:
        assert out == redact_text(text)
    finally:
        r._GITHUB_PREFIX = original


_PAIR_PIECES = st.sampled_from(
    [":", "=", " ", "\n", '"', "'", "\\", "x", "7", "Token", "token", "PASSWORD", "secret"]
    + ["api_key", "Api-Key", "cookie", "authorization", "private_key", "max_tokens", "Bearer"]
)


@settings(max_examples=3000, deadline=None)
@given(st.lists(_PAIR_PIECES, max_size=14).map("".join))
def test_texts_without_a_separator_skip_the_pair_scan_only(text: str) -> None:
    # redact_text looks for a secret's name only in text with a ":" or a "=": the same
    # text out as when every text is looked at.
    from agentrun.security import redact as r

    out = redact_text(text)
    original = r._may_hold_pair
    r._may_hold_pair = lambda text, lowered: any(h in lowered for h in r._SECRET_HINTS)
    try:
        assert out == redact_text(text)
    finally:
        r._may_hold_pair = original
