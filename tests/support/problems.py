"""Whether a refused manifest's problem says where it is, and whether its advice fits it."""

from __future__ import annotations

import re

from avsim.errors import Problem

_LINE = re.compile(r"\bline \d+")
#: Problems about the whole file, which has no smaller place to name.
WHOLE_FILE = (
    "the file is empty",
    "the document is empty",
    "the file is not UTF-8",
    "is too large",
    "at the top level, got",
    "... and ",
)


def assert_located(p: Problem) -> None:
    """``p`` names where it is, and its advice fits it."""
    assert p.message.strip(), p
    assert (
        p.path
        or _LINE.search(p.message)
        or p.message.startswith(WHOLE_FILE)
        or any(w in p.message for w in WHOLE_FILE)
    ), f"no location: {p}"
    if "remove the tag" in p.message or "without the tag" in p.message:
        assert "!" in p.message, f"advice about a tag, but the message shows none: {p}"
