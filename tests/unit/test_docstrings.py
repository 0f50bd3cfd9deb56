"""A module docstring says what the module is for in at most 8 lines; the why lives in docs/design.md.

``ALLOWED`` names the modules still over, each with the reason; remove a module's line when its
docstring is shortened (the second test fails until then, so the list only shrinks).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "provider" / "avsim"
MAX_LINES = 8

_TABLES = "holds the written-by/read-by table that tests/unit/contracts/test_tables.py checks"
_GENERATED = "docs/manifest.md is generated from its docstring's body (provider/avsim_docgen)"

#: Module (path under provider/avsim) -> why its docstring may be longer than MAX_LINES, for now.
ALLOWED: dict[str, str] = {
    "contracts/__init__.py": _TABLES,
    "contracts/case.py": _TABLES,
    "contracts/pod.py": _TABLES,
    "contracts/week.py": _TABLES,
    "manifest/loader.py": _GENERATED,
    "manifest/validation.py": _GENERATED,
}


def docstring_lines(source: str) -> int:
    """The lines of a module's docstring as ``help()`` shows it (indentation and blank ends removed)."""
    doc = ast.get_docstring(ast.parse(source))
    return len(doc.splitlines()) if doc else 0


def _lengths() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): docstring_lines(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_the_count_is_of_the_docstring_lines_only() -> None:
    nine = '"""One.\n\n' + "".join(f"line {i}\n" for i in range(7)) + '"""\nX = 1  # not counted\n'
    assert docstring_lines(nine) == 9
    assert docstring_lines('"""Just one line."""\n') == 1
    assert docstring_lines("X = 1\n") == 0


def test_every_module_docstring_is_at_most_8_lines() -> None:
    over = {name: n for name, n in _lengths().items() if n > MAX_LINES and name not in ALLOWED}
    assert not over, (
        f"module docstrings over {MAX_LINES} lines (say what the module is for; move the why to "
        f"docs/design.md, once, and point there): {over}"
    )


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_an_allowed_module_is_still_over(name: str) -> None:
    n = _lengths().get(name)
    assert n is not None, f"{name} is gone: remove it from ALLOWED"
    assert n > MAX_LINES, f"{name}'s docstring has {n} lines now: remove it from ALLOWED"


#: A pointer to the why: ``docs/<page>.md, "<section>"`` (the section's heading or bold lead-in starts so).
_POINTER = re.compile(r'docs/([\w-]+\.md),? "([^"]+)"')


def _sections(page: str) -> list[str]:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    headings = [
        re.sub(r"^\d+\.\s*", "", line.lstrip("#").strip())
        for line in text.splitlines()
        if line.startswith("#")
    ]
    return headings + re.findall(r"\*\*([^*]+)\*\*", text)


def test_every_pointer_of_a_module_docstring_names_a_section_that_exists() -> None:
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
        for page, section in _POINTER.findall(doc):
            exists = (ROOT / "docs" / page).is_file()
            if not exists or not any(s.startswith(section) for s in _sections(page)):
                broken.append(f"{path.relative_to(PACKAGE)}: docs/{page}, {section!r}")
    assert not broken, f"module docstrings point to sections that do not exist: {broken}"
