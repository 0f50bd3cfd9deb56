"""Issue 16: every rejection says where, and no advice is wrong for the error.

Every problem of every refused corpus file (``tests/unit/corpus``) and of the fuzzer's refusals
(``test_validation_fuzz.py`` calls ``tests.support.problems.assert_located`` on each) names a
location: a document path, or a line (YAML and JSON syntax, a byte offset for encoding errors), or
is a problem of the whole file (empty, too large, not a mapping at the top level). And advice fits
its error: "remove the tag" only where there is a tag.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.problems import assert_located

from avsim.errors import ManifestError
from avsim.manifest.loader import load_manifest
from avsim.manifest.policy import ManifestPolicy

CORPUS = Path(__file__).parents[1] / "corpus"
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
