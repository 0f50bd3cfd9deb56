"""Credentials never belong in a manifest: find credential-shaped strings and report them masked.

:func:`secret_problems` looks at every string of a parsed document, mapping keys included: credential
shapes (:data:`RULES`), non-empty values under credential-named keys (:func:`is_sensitive_key`) and the
argument after a credential-named option. :func:`mask_secrets` keeps only the non-secret part of a match
(``AKIA****``). Credentials reach avsim only through Airflow connections. Why, and what is covered:
docs/security.md, "The manifest" (*No credentials*).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from avsim.manifest.links import Link, unlink

Loc = tuple[Hashable, ...]

MASK = "****"
#: How to get a credential to a phase instead; ends every message of this module.
USE_A_CONNECTION = (
    "a manifest is stored, shown and passed to every phase, so it must not hold credentials: keep the "
    "secret in an Airflow connection (or your secrets backend) and refer to it by its connection id, "
    "e.g. s3://<conn_id>@bucket/key"
)


@dataclass(frozen=True)
class Rule:
    """One credential shape. ``pattern`` has a group ``secret`` (what the mask hides); what the match
    has before and after it is shown. ``quick`` matches every string ``pattern`` can match, and is
    cheap: almost every string of a manifest is passed by it, not by ``pattern``."""

    kind: str
    pattern: re.Pattern[str]
    quick: re.Pattern[str]
    needles: tuple[str, ...]

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        if self.quick.search(text):
            yield from self.pattern.finditer(text)


def _rule(kind: str, pattern: str, needles: tuple[str, ...], flags: int = 0) -> Rule:
    """A rule; a string that holds none of ``needles`` (compared with ``flags``) cannot match it.

    A secret group never starts with the mask, so masking is idempotent: a message that already
    shows ``password=****`` keeps the text after it."""
    pattern = re.sub(r"\(\?P<(secret\w*)>", r"(?!\\*{4})(?P<\1>", pattern)
    return Rule(
        kind, re.compile(pattern, flags), re.compile("|".join(map(re.escape, needles)), flags), needles
    )


_NOT_ALNUM_BEFORE = r"(?<![A-Za-z0-9])"
_AWS_PREFIXES = (
    "AKIA",
    "ASIA",
    "ABIA",
    "ACCA",
    "AGPA",
    "AIDA",
    "AIPA",
    "ANPA",
    "ANVA",
    "AROA",
    "APKA",
    "ASCA",
)
_ASSIGNED_NAMES = (
    r"(?:aws_)?secret_access_key|secret[_-]?key|password|passwd|passphrase|client[_-]?secret|"
    r"api[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key|account[_-]?key|"
    r"shared[_-]?access[_-]?key"
)
_QUERY_NAMES = (
    r"password|passwd|pwd|pass|secret|token|access_token|refresh_token|id_token|api_key|apikey|"
    r"client_secret|sig|signature|x-amz-signature|x-amz-security-token|x-goog-signature"
)

#: The credential shapes, most specific first (a secret matched by two rules is reported by the first).
RULES: tuple[Rule, ...] = (
    _rule(
        "a private key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?P<secret>(?:(?!-----END)[\s\S])*)",
        ("PRIVATE KEY",),
    ),
    _rule(
        "an AWS access key id",
        _NOT_ALNUM_BEFORE + "(?:" + "|".join(_AWS_PREFIXES) + r")(?P<secret>[A-Z0-9]{16})(?![A-Za-z0-9])",
        _AWS_PREFIXES,
    ),
    _rule("a password in a URI", r"[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@?#]*:(?P<secret>[^\s/@?#]+)@", ("@",)),
    _rule(
        "a credential in a URI query",
        rf"[?&;](?:{_QUERY_NAMES})=(?P<secret>[^&#\s]+)",
        ("?", "&", ";"),
        re.IGNORECASE,
    ),
    _rule(
        "a bearer or basic credential",
        r"\b(?:Bearer|Basic)\s+(?P<secret>[A-Za-z0-9\-._~+/]{12,}=*)",
        ("Bearer", "Basic"),
    ),
    _rule(
        "a JSON web token",
        _NOT_ALNUM_BEFORE + r"eyJ(?P<secret>[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})",
        ("eyJ",),
    ),
    _rule(
        "an assigned credential",
        rf"\b(?:{_ASSIGNED_NAMES})\s*[:=]\s*['\"]?(?P<secret>[^\s'\",;&]{{3,}})",
        ("key", "pass", "secret", "token"),
        re.IGNORECASE,
    ),
    _rule(
        "an API token",
        _NOT_ALNUM_BEFORE
        + r"(?:gh[pousr]_(?P<secret>[A-Za-z0-9]{30,})"
        + r"|github_pat_(?P<secret_2>[A-Za-z0-9_]{22,})"
        + r"|glpat-(?P<secret_3>[A-Za-z0-9_-]{20,})"
        + r"|xox[abposr]-(?P<secret_4>[A-Za-z0-9-]{10,})"
        + r"|AIza(?P<secret_5>[0-9A-Za-z_-]{35})"
        + r"|[sr]k_(?:live|test)_(?P<secret_6>[0-9A-Za-z]{16,})"
        + r"|sk-(?:ant-|proj-)?(?P<secret_7>[A-Za-z0-9_-]{20,})"
        + r"|hf_(?P<secret_8>[A-Za-z]{30,})"
        + r"|npm_(?P<secret_9>[A-Za-z0-9]{36})"
        + r"|pypi-(?P<secret_10>AgEIcHlwaS5vcmc[A-Za-z0-9_-]{16,})"
        + r"|SG\.(?P<secret_11>[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}))",
        (
            *("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "AIza"),
            *("sk_live_", "sk_test_", "rk_live_", "rk_test_", "sk-", "hf_", "npm_", "pypi-", "SG."),
        ),
    ),
)
#: A string whose lower-case form does not match this matches no rule (every rule's needles; faster
#: than one case-insensitive pattern).
_QUICK = re.compile("|".join(sorted({re.escape(n.lower()) for r in RULES for n in r.needles})))

#: The last word(s) of a credential-named key (``DB_PASSWORD``, ``githubToken``, ``api-key``).
_SENSITIVE_LAST = frozenset(
    {"password", "passwd", "pwd", "passphrase", "secret", "token", "credential", "credentials", "apikey"}
)
_SENSITIVE_BEFORE_KEY = frozenset({"api", "access", "secret", "private", "account", "signing", "encryption"})
#: Values that are flags, not credentials (``USE_TOKEN: "true"``).
_HARMLESS_VALUES = frozenset(
    {"true", "false", "yes", "no", "on", "off", "none", "null", "enabled", "disabled"}
)
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: Longer keys and options are not names of anything (and are not kept in the caches).
_LONGEST_NAME = 128
_OPTION = re.compile(r"^--?(?P<name>[A-Za-z0-9_-]+)$")


@dataclass(frozen=True)
class Finding:
    """A credential-shaped part of a string: what it looks like, and the match with its secret masked."""

    kind: str
    masked: str


def _secret_span(match: re.Match[str]) -> tuple[int, int]:
    for name, value in match.groupdict().items():
        if value is not None and name.startswith("secret"):
            return match.span(name)
    return match.span()


def _masked(match: re.Match[str]) -> str:
    start, end = _secret_span(match)
    text = match.string
    return f"{text[match.start() : start]}{MASK}{text[end : match.end()]}"


def find_secrets(text: str) -> tuple[Finding, ...]:
    """The credential shapes in ``text``, each reported once (a URI query is not also an assignment)."""
    if not _QUICK.search(text.lower()):
        return ()
    found: list[Finding] = []
    taken: list[tuple[int, int]] = []  # secret spans already reported
    for rule in RULES:
        for match in rule.finditer(text):
            start, end = _secret_span(match)
            if any(start < e and s < end for s, e in taken):
                continue
            taken.append((start, end))
            found.append(Finding(rule.kind, _masked(match)))
    return tuple(found)


def mask_secrets(text: str) -> str:
    """``text`` with the secret part of every credential shape replaced by ``****``."""
    if not _QUICK.search(text.lower()):
        return text
    for rule in RULES:
        if rule.quick.search(text):
            text = rule.pattern.sub(_masked, text)
    return text


def is_sensitive_key(key: str) -> bool:
    """Whether a mapping key names a credential: its last word is ``password``, ``secret``, ``token``,
    ``credentials``... or it ends in ``api_key``, ``access_key``, ``secret_key``, ``private_key``.

    ``TOKEN_LIMIT``, ``max_tokens``, ``SECRET_NAME`` and ``password_file`` are not: they name a
    setting or where a secret is, not the secret."""
    return len(key) <= _LONGEST_NAME and _sensitive_name(key)


@lru_cache(maxsize=4096)
def _sensitive_name(key: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(key)]
    if not words:
        return False
    if words[-1] in _SENSITIVE_LAST:
        return True
    return len(words) >= 2 and words[-1] == "key" and words[-2] in _SENSITIVE_BEFORE_KEY


def _holds_value(value: str) -> bool:
    v = value.strip()
    return len(v) >= 4 and v.lower() not in _HARMLESS_VALUES and not v.startswith("-")


def _message(kind: str, masked: str) -> str:
    return f"{kind} ({masked}): {USE_A_CONNECTION}"


def secret_problems(data: Any, limit: int | None = None) -> list[tuple[Loc, str]]:
    """Every credential-shaped string of a parsed document, with its location and a masked message
    (``limit``: stop after about that many; each costs a path)."""
    if not _suspicious(data):
        return []
    out: list[tuple[Loc, str]] = []
    stack: list[tuple[Any, Link]] = [(data, None)]
    while stack and (limit is None or len(out) < limit):
        node, link = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                here = (link, key)
                if isinstance(key, str):
                    for f in find_secrets(key):
                        out.append((unlink(here), _message(f"{f.kind} in a key", f.masked)))
                    named = isinstance(value, str) and is_sensitive_key(key) and _holds_value(value)
                    if named and not find_secrets(value):  # a value with a shape is reported with it
                        out.append((unlink(here), _message(f"a credential under the key {key!r}", MASK)))
                stack.append((value, here))
        elif isinstance(node, list | tuple):
            for i, value in enumerate(node):
                stack.append((value, (link, i)))
                if isinstance(value, str) and _sensitive_option(value) and i + 1 < len(node):
                    after = node[i + 1]
                    if isinstance(after, str) and _holds_value(after) and not find_secrets(after):
                        out.append(((*unlink(link), i + 1), _message(f"a credential after {value!r}", MASK)))
        elif isinstance(node, str):
            for f in find_secrets(node):
                out.append((unlink(link), _message(f.kind, f.masked)))
    return out


def _suspicious(data: Any) -> bool:
    """A quick pass without paths: does any string, key or key/value pair look like a credential?"""
    stack: list[Any] = [data]
    seen: set[str] = set()
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str):
                    if key not in seen:
                        seen.add(key)
                        if find_secrets(key):
                            return True
                    if isinstance(value, str) and is_sensitive_key(key) and _holds_value(value):
                        return True
                if isinstance(value, str):
                    if value not in seen:
                        seen.add(value)
                        if find_secrets(value):
                            return True
                elif isinstance(value, dict | list | tuple):
                    stack.append(value)
        elif isinstance(node, list | tuple):
            previous: Any = None
            for value in node:
                if isinstance(value, str):
                    if value not in seen:
                        seen.add(value)
                        if find_secrets(value):
                            return True
                    if isinstance(previous, str) and _sensitive_option(previous) and _holds_value(value):
                        return True
                elif isinstance(value, dict | list | tuple):
                    stack.append(value)
                previous = value
        elif isinstance(node, str) and find_secrets(node):
            return True
    return False


def _sensitive_option(text: str) -> bool:
    return len(text) <= _LONGEST_NAME and _sensitive_option_name(text)


@lru_cache(maxsize=4096)
def _sensitive_option_name(text: str) -> bool:
    option = _OPTION.match(text)
    return bool(option and is_sensitive_key(option.group("name")))
