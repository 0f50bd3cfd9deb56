"""The alphabets of a manifest's identifiers, and what "unique" means for them.

Case ids: ASCII letters, digits, ``.``, ``_``, ``-``; starting with a letter or digit; at most 128.
Graph, phase and run phase names: ASCII letters, digits, ``_``; starting with a letter; at most 63.
Two identifiers of one kind may not differ in letter case alone, and a refused character is named by
its code point and Unicode name. Why: docs/security.md, "The manifest" (*Identifiers*).
"""

from __future__ import annotations

import re
import unicodedata

CASE_ID_ALPHABET = "ASCII letters, digits, '.', '_' or '-'"
NAME_ALPHABET = "ASCII letters, digits or '_'"
#: Letters of other scripts that look like ASCII ones (for the message only: they are refused anyway).
_LOOK_ALIKES = dict(
    zip(
        "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455\u0501\u04bb\u0410\u0412\u0415\u041a"
        "\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u03bf\u03b1\u03bd\u0391\u0392\u0395\u0397\u0399\u039a"
        "\u039c\u039d\u039f\u03a1\u03a4\u03a7\u0131",
        "aeopcyxijsdhABEKMHOPCTXoavABEHIKMNOPTXi",
        strict=True,
    )
)
_CASE_ID_CHARS = re.compile(r"[A-Za-z0-9._-]")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_]")
CASE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


def char_name(ch: str) -> str:
    """``'x' (U+0078 LATIN SMALL LETTER X)``."""
    return f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed character')})"


def case_id_problem(value: str) -> str | None:
    """Why ``value`` is no valid case id, or None."""
    return _problem(value, "case id", _CASE_ID_CHARS, CASE_ID_RE, CASE_ID_ALPHABET, 128, "a letter or digit")


def name_problem(value: str, what: str = "name") -> str | None:
    """Why ``value`` is no valid graph/phase name, or None."""
    return _problem(value, what, _NAME_CHARS, NAME_RE, NAME_ALPHABET, 63, "a letter")


def fold(value: str) -> str:
    """The form two identifiers are compared in for uniqueness (letter case ignored)."""
    return value.casefold()


def _problem(
    value: str,
    what: str,
    chars: re.Pattern[str],
    full: re.Pattern[str],
    alphabet: str,
    limit: int,
    first: str,
) -> str | None:
    if full.match(value):
        return None
    rule = f"use {alphabet}, starting with {first} (at most {limit} characters)"
    if not value:
        return f"{what} is empty; {rule}"
    if value != value.strip():
        return f"{what} {value!r} has leading or trailing whitespace; remove it ({rule})"
    for pos, ch in enumerate(value):
        if not chars.match(ch):
            look = ""
            if not ch.isascii():
                ascii_form = _LOOK_ALIKES.get(ch) or (
                    unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
                )
                look = (
                    f", which looks like {ascii_form!r} but is not" if ascii_form else ", which is not ASCII"
                )
            return (
                f"{what} {value!r}: character {char_name(ch)} at position {pos} is not allowed{look}; {rule}"
            )
    if len(value) > limit:
        return f"{what} {value[:40]!r}... is {len(value)} characters long; {rule}"
    return f"{what} {value!r} must start with {first}; {rule}"
