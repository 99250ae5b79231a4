"""Secret redaction applied before anything is stored or logged.

:func:`redact` walks a JSON-like value and returns a copy in which

* the value of every dict key that names a secret (see :func:`is_secret_key`)
  is replaced by :data:`REDACTED`, and
* every string is passed through :func:`redact_text`.

:func:`redact_text` replaces, inside free text, things that look like
credentials: OpenAI-style ``sk-...`` keys, AWS access key ids, ``Bearer``
tokens (the word ``Bearer`` is kept), GitHub tokens, PEM private keys, and the
values of secret-named keys written as ``"key": "value"`` (JSON or Python
reprs, also inside tool-call argument strings), ``key=value`` (query strings,
env files, kwargs) or ``key: value`` at the start of a line (HTTP headers,
YAML).

Redaction errs on the side of hiding: a prose line starting with
``Password: ...`` loses its text. Unchanged subtrees and strings are returned
as the same objects, so redacting a snapshot keeps the item identity the
snapshot delta encoder relies on.

Standard library only.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_KEY_NAMES",
    "hides_nothing",
    "is_secret_key",
    "redact",
    "redact_text",
]

#: Replacement for anything secret.
REDACTED = "[REDACTED]"

#: Key names whose values are secrets. A key matches when, split into words
#: at ``_``, ``-``, ``.`` and camelCase boundaries, it contains one of these
#: names as consecutive words (see :func:`is_secret_key`).
SECRET_KEY_NAMES: tuple[str, ...] = (
    "api_key",
    "apikey",
    "api-key",
    "authorization",
    "password",
    "passwd",
    "token",
    "access_token",
    "secret",
    "client_secret",
    "private_key",
    "cookie",
    "x-api-key",
)

# Splits "X-Api-Key", "openai_api_key", "accessToken" and "APIKey" into words.
_WORD_SPLIT = re.compile(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _words(key: str) -> tuple[str, ...]:
    return tuple(part.lower() for part in _WORD_SPLIT.split(key) if part)


_SECRET_WORDS: frozenset[tuple[str, ...]] = frozenset(_words(name) for name in SECRET_KEY_NAMES)
_SECRET_WHOLE: frozenset[str] = frozenset(name.lower() for name in SECRET_KEY_NAMES)

# A secret word followed by one of these names something *about* the secret
# (``token_count``, ``password_policy``, ``token_url``, ``cookie_name``), not
# the secret itself.
_METADATA_LAST_WORDS = frozenset(
    {
        "count",
        "counts",
        "limit",
        "limits",
        "len",
        "length",
        "size",
        "type",
        "kind",
        "name",
        "usage",
        "ttl",
        "expiry",
        "expires",
        "url",
        "uri",
        "endpoint",
        "path",
        "file",
        "env",
        "header",
        "field",
        "hint",
        "policy",
        "required",
        "enabled",
    }
)
# Likewise for a leading word: ``max_token``, ``has_password``, ``use_cookie``.
_METADATA_FIRST_WORDS = frozenset({"max", "min", "num", "n", "total", "has", "is", "use"})


@functools.lru_cache(maxsize=4096)
def is_secret_key(key: str) -> bool:
    """Whether a dict key (or header / variable name) names a secret.

    True when the lower-cased key is one of :data:`SECRET_KEY_NAMES`, or when
    its words (split at ``_``, ``-``, ``.`` and camelCase) contain one of those
    names as consecutive words -- ``OPENAI_API_KEY``, ``X-Api-Key``,
    ``github_token``, ``accessToken``, ``clientSecret``. Keys whose first or
    last word marks metadata are not secrets: ``max_tokens``,
    ``token_count``, ``password_policy``, ``token_url``, ``cookie_name``.
    Plurals and longer words do not match: ``tokens``, ``tokenizer_name``.
    """
    if not isinstance(key, str):
        return False
    if key.lower() in _SECRET_WHOLE:
        return True
    words = _words(key)
    if not words or words[-1] in _METADATA_LAST_WORDS or words[0] in _METADATA_FIRST_WORDS:
        return False
    for name in _SECRET_WORDS:
        size = len(name)
        for start in range(len(words) - size + 1):
            if words[start : start + size] == name:
                return True
    return False


def hides_nothing(value: Any) -> bool:
    # Empty and boolean values cannot leak a secret, and keeping them shows
    # whether a credential was set at all.
    return value is None or value == "" or isinstance(value, bool) or value == REDACTED


# ---------------------------------------------------------------------------
# Free-text rules.
# ---------------------------------------------------------------------------

_PEM_PRIVATE_KEY = re.compile(
    # A key cut off before its END line (truncated log output) is still redacted.
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|.*\Z)",
    re.DOTALL,
)

# HTTP auth schemes kept in front of a redacted credential.
_AUTH_SCHEME = re.compile(r"(?i:bearer|basic|token|digest)[ \t]+(?=\S)")

# Pair patterns match a key and its separator only; the value is matched
# separately, and only after the key proved secret. Matching the value up
# front made text like "x=x=x=..." quadratic.

# "key": value -- JSON, Python reprs, and one level of escaped JSON (\"key\": \"value\").
_QUOTED_KEY = re.compile(r"""(?P<q>\\?["'])(?P<key>[\w.\-]{1,64})(?P=q)[ \t]*:[ \t]*""")
_QUOTED_VALUE = re.compile(
    r"""\\"(?:(?!\\").)*\\"|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s,}\]"'\\]+"""
)

# key=value -- query strings, env files, command lines, kwargs.
_ASSIGN_KEY = re.compile(r"""(?<![\w.\-])(?P<key>[A-Za-z_][\w.\-]{0,63})[ \t]*=(?!=)[ \t]*""")
_ASSIGN_VALUE = re.compile(r"""(?:"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[^\s&,;"'<>]+)""")

# key: value at the start of a line -- HTTP headers, YAML, .netrc-like files.
_LINE_KEY = re.compile(
    r"""^[ \t]*(?:[-*][ \t]+)?(?P<key>[A-Za-z_][\w.\-]{0,63})[ \t]*:[ \t]*(?=\S)""", re.MULTILINE
)
# To the end of the line, without trailing blanks (backtracks over those only).
_LINE_VALUE = re.compile(r"[^\r\n]*[^\s]")

# Cheap test run before the pair rules: every secret key, lower-cased,
# contains one of these. (Substring tests on str.lower() are ~100x faster
# than an equivalent case-insensitive regex.)
_SECRET_HINTS = (
    "token",
    "passw",
    "secret",
    "cookie",
    "authoriz",
    "apikey",
    "api_key",
    "api-key",
    "api.key",
    "private",
)

_TOKENS = re.compile(
    r"(?<![\w\-])sk-[A-Za-z0-9_\-]{16,}"  # OpenAI, incl. sk-proj-...
    r"|(?<![A-Z0-9])AKIA[0-9A-Z]{16}(?![A-Z0-9])"  # AWS access key id
    r"|(?<!\w)(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"  # GitHub
)

# What every GitHub token in _TOKENS starts with: a text without one (most text that has an
# underscore: identifiers, "call_12") is not scanned for tokens at all.
_GITHUB_PREFIX = re.compile(r"gh[pousr]_|github_pat_")

_BEARER = re.compile(r"(?<![\w\-])(?P<scheme>(?i:bearer))[ \t]+(?P<tok>[A-Za-z0-9\-._~+/]+=*)")


def _redact_pair_value(val: str) -> str:
    """Redacted form of a value matched by one of the ``*_PAIR`` patterns."""
    for quote in ('\\"', '"', "'"):
        if len(val) >= 2 * len(quote) and val.startswith(quote) and val.endswith(quote):
            inner = val[len(quote) : -len(quote)]
            if hides_nothing(inner):
                return val
            scheme = _AUTH_SCHEME.match(inner)
            kept = scheme.group(0) if scheme else ""
            return f"{quote}{kept}{REDACTED}{quote}"
    if val in ("null", "None", "true", "false", "True", "False", "~", REDACTED):
        return val
    scheme = _AUTH_SCHEME.match(val)
    if scheme:
        return scheme.group(0) + REDACTED
    return REDACTED


def _sub_secret_pairs(
    key_pattern: re.Pattern[str],
    value_pattern: re.Pattern[str],
    text: str,
    *,
    quote_bare: bool = False,
) -> str:
    # After a non-secret key the search goes on right behind its separator,
    # so pairs nested in its value are still found (tool-call arguments are
    # JSON inside a JSON string).
    pieces: list[str] = []
    copied_to = 0
    search_from = 0
    while (match := key_pattern.search(text, search_from)) is not None:
        search_from = match.end()
        if not is_secret_key(match.group("key")):
            continue
        value = value_pattern.match(text, match.end())
        if value is None or not value.group(0):
            continue
        val = value.group(0)
        new = _redact_pair_value(val)
        if quote_bare and new == REDACTED and val != REDACTED:
            # Keep JSON valid: a redacted number becomes a string.
            new = f'"{REDACTED}"'
        pieces.append(text[copied_to : value.start()])
        pieces.append(new)
        copied_to = search_from = value.end()
    if not pieces:
        return text
    pieces.append(text[copied_to:])
    return "".join(pieces)


def _bearer(match: re.Match[str]) -> str:
    token = match.group("tok")
    # "Bearer of bad news" is prose: real tokens have digits or punctuation,
    # or are long.
    if len(token) >= 20 or not token.isalpha():
        return f"{match.group('scheme')} {REDACTED}"
    return match.group(0)


def _may_hold_pair(text: str, lowered: str) -> bool:
    """Whether `text` may hold a secret-named pair: a separator and a secret's name. The
    separators first: much long text (prose) has neither, and then ten scans are saved."""
    return (":" in text or "=" in text) and any(hint in lowered for hint in _SECRET_HINTS)


def redact_text(text: str) -> str:
    """Return ``text`` with credentials replaced by :data:`REDACTED`.

    Covers PEM private keys, values of secret-named keys in ``"key": value``,
    ``key=value`` and line-leading ``key: value`` form (an auth scheme such as
    ``Bearer`` is kept), ``sk-`` keys, AWS access key ids, GitHub tokens and
    ``Bearer <token>``. Returns ``text`` itself when nothing was found.
    """
    # Substring tests are much cheaper than the regexes and rule most text out.
    out = text
    if "-----BEGIN" in out:
        out = _PEM_PRIVATE_KEY.sub(REDACTED, out)
    lowered = out.lower()
    if _may_hold_pair(out, lowered):
        if ":" in out:
            out = _sub_secret_pairs(_QUOTED_KEY, _QUOTED_VALUE, out, quote_bare=True)
            out = _sub_secret_pairs(_LINE_KEY, _LINE_VALUE, out)
        if "=" in out:
            out = _sub_secret_pairs(_ASSIGN_KEY, _ASSIGN_VALUE, out)
    if "sk-" in out or "AKIA" in out or ("_" in out and _GITHUB_PREFIX.search(out)):
        out = _TOKENS.sub(REDACTED, out)
    if "bearer" in lowered:
        out = _BEARER.sub(_bearer, out)
    return text if out == text else out


# ---------------------------------------------------------------------------
# Structures.
# ---------------------------------------------------------------------------


def redact(value: Any) -> Any:
    """Return a redacted copy of a JSON-like value (dicts, lists, tuples, scalars).

    Values under secret-named keys (:func:`is_secret_key`) are replaced wholly
    by :data:`REDACTED`, whatever their type, except ``None``, ``""`` and
    booleans, which hide nothing. Every other string goes through
    :func:`redact_text`. Keys are not rewritten. The input is never mutated,
    and any subtree with nothing to redact is returned as the same object.
    """
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        changed: dict[Any, Any] | None = None
        for key, item in value.items():
            if is_secret_key(key):
                new = item if hides_nothing(item) else REDACTED
            else:
                new = redact(item)
            if new is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list | tuple):
        items: list[Any] | None = None
        for i, item in enumerate(value):
            new = redact(item)
            if new is not item:
                if items is None:
                    items = list(value)
                items[i] = new
        if items is None:
            return value
        return items if isinstance(value, list) else tuple(items)
    return value
