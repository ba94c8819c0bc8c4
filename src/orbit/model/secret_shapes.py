"""Which values are, by their shape, credentials someone pasted in: a Hugging Face, GitHub,
OpenAI or GitLab token, an AWS access key id, a PEM private key, a URL with a password in it.

Each shape asks for its issuer's prefix and the length and alphabet its tokens really have, so
ordinary values stay ordinary: a path, `sk-learn`, `hf_cache`, a model name such as
`sk-learn-baseline-v2`, a commit hash. A shape names its kind; the value is never repeated."""

from __future__ import annotations

import re
from collections.abc import Callable

# Where a token may begin and end: not in the middle of a longer word or identifier.
_START = r"(?<![A-Za-z0-9_-])"
_END = r"(?![A-Za-z0-9_-])"


def _random_looking(body: str) -> bool:
    """Upper and lower case letters and digits, with a run of 16 letters and digits: how the
    base62/base64url bodies of issued tokens look, and how hyphenated names do not."""
    return (
        any(c.isupper() for c in body)
        and any(c.islower() for c in body)
        and any(c.isdigit() for c in body)
        and re.search(r"[A-Za-z0-9]{16}", body) is not None
    )


def _mixed_case(body: str) -> bool:
    return any(c.isupper() for c in body) and any(c.islower() for c in body)


def _always(body: str) -> bool:
    return True


# (kind, pattern whose group "body" is checked, check of the body)
_SHAPES: tuple[tuple[str, re.Pattern[str], Callable[[str], bool]], ...] = (
    (
        "a Hugging Face token",
        re.compile(_START + r"hf_(?P<body>[A-Za-z0-9]{30,})" + _END),
        _mixed_case,
    ),
    (
        "a GitHub token",
        re.compile(_START + r"(?:gh[pousr]_(?P<body>[A-Za-z0-9]{36,}))" + _END),
        _mixed_case,
    ),
    (
        "a GitHub token",
        re.compile(_START + r"github_pat_(?P<body>[A-Za-z0-9_]{50,})" + _END),
        _always,
    ),
    (
        "an API key (sk-...)",
        re.compile(_START + r"sk-(?P<body>[A-Za-z0-9_-]{20,})" + _END),
        _random_looking,
    ),
    (
        "a GitLab token",
        re.compile(_START + r"glpat-(?P<body>[A-Za-z0-9_-]{20,})" + _END),
        _always,
    ),
    (
        "an AWS access key id",
        re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)(?P<body>[A-Z0-9]{16})(?![A-Z0-9])"),
        _always,
    ),
    (
        "a private key",
        re.compile(r"-----BEGIN (?P<body>[A-Z0-9 ]*)PRIVATE KEY-----"),
        _always,
    ),
    (
        "a URL with a password",
        # a scheme is short (RFC 3986 sets no bound; 32 covers every registered one):
        # unbounded, a long run of letters would be scanned again from each of its positions
        re.compile(
            r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/\s:@]+:(?P<body>[^/\s@]+)@"
        ),
        _always,
    ),
)


def secret_shape(value: str) -> str | None:
    """The kind of credential `value` holds (`"a Hugging Face token"`), or None."""
    for kind, pattern, check in _SHAPES:
        if any(check(m.group("body")) for m in pattern.finditer(value)):
            return kind
    return None
