"""Issue 16: every rejection says where, and no advice is wrong for the error.

Every problem of every refused corpus file (``tests/unit/corpus``) and of the fuzzer's refusals
(:mod:`test_manifest_fuzz` calls :func:`assert_located` on each) names a location: a document path,
or a line (YAML and JSON syntax, a byte offset for encoding errors), or is a problem of the whole
file (empty, too large, not a mapping at the top level). And advice fits its error: "remove the
tag" only where there is a tag.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from avsim.errors import ManifestError, Problem
from avsim.manifest.loader import load_manifest
from avsim.manifest.policy import ManifestPolicy

CORPUS = Path(__file__).parent / "corpus"
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


CORPUS_FILES = sorted(
    f for f in CORPUS.iterdir() if f.is_file() and not f.name.startswith("good_") and f.suffix != ".md"
)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda f: f.name)
def test_every_corpus_rejection_names_a_location(path: Path) -> None:
    with pytest.raises(ManifestError) as exc:
        load_manifest(path, policy=ManifestPolicy(max_bytes=64 * 2**20))
    assert exc.value.problems
    for p in exc.value.problems:
        assert_located(p)


def test_the_corpus_is_not_empty() -> None:
    assert len(CORPUS_FILES) >= 80
