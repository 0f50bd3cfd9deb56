"""The user docs stay true: their links resolve, their pictures are small, and the error they quote
is the one the validator prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from avsim.errors import ManifestError
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("examples/*/README.md")),
]
#: [text](target) and ![alt](target), not inside inline code.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def local_links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = [t for t in local_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to files that do not exist: {broken}"


def test_the_screenshots_are_linked_and_small() -> None:
    shots = sorted((ROOT / "docs" / "img").glob("*.png"))
    linked = {(ROOT / "docs" / t).resolve() for t in local_links(ROOT / "docs" / "concepts.md")}
    assert len(shots) >= 2
    for shot in shots:
        assert shot.resolve() in linked, f"{shot.name} is not shown by docs/concepts.md"
        assert shot.stat().st_size < 300_000, f"{shot.name} is {shot.stat().st_size:,} bytes"


def test_the_quoted_unknown_graph_error_is_the_validators() -> None:
    doc = sample_manifest(3)
    doc["cases"][0]["graph"] = "perception_v2"
    with pytest.raises(ManifestError) as raised:
        validate_manifest(doc)
    [problem] = [p for p in raised.value.problems if p.path == "cases[0].graph"]
    quoted = f"`cases[412].graph: {problem.message}`"
    for page in (ROOT / "README.md", ROOT / "docs" / "manifest.md"):
        flat = " ".join(page.read_text().split())
        assert quoted in flat, f"{page.name} does not quote {quoted}"


#: User docs say what is, not how it came to be (docs/performance.md is the log of measurements).
HISTORY_FREE = [
    "README.md",
    "docs/concepts.md",
    "docs/writing-a-phase.md",
    "docs/design.md",
    "docs/manifest.md",
]
HISTORY_FREE += ["docs/operations.md", "docs/deployment.md"]


@pytest.mark.parametrize("name", HISTORY_FREE)
def test_user_docs_cite_no_issue_of_this_project(name: str) -> None:
    found = re.findall(r"(?i)\bissues? \d+[^.\n]*", (ROOT / name).read_text())
    assert not found, f"{name} cites this project's issues: {found}"
