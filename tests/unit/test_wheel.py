"""The wheel ships the runtime package, with the laptop/CI tools in one clearly named subpackage.

Builds the real wheel with the project's build backend (hatchling's API, in-process and offline)
from this checkout and reads what it holds: no documentation generator, the demo, the local stack
runner and the fake simulator only under ``avsim/devstack/``, and no runtime module that imports
them (``avsim demo`` loads the demo when it is run: the only exception).
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV = "avsim/devstack/"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    from hatchling.builders.wheel import WheelBuilder

    out = tmp_path_factory.mktemp("wheel")
    (built,) = WheelBuilder(str(ROOT)).build(directory=str(out), versions=["standard"])
    with zipfile.ZipFile(built) as zf:
        yield zf


def _sources(wheel: zipfile.ZipFile) -> dict[str, str]:
    return {n: wheel.read(n).decode("utf-8") for n in wheel.namelist() if n.endswith(".py")}


def test_the_docs_generator_is_not_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert "avsim/cli.py" in names and "avsim/manifest/models.py" in names
    assert not [n for n in names if n.startswith("avsim_docgen/")]
    assert not [n for n in names if n.startswith("avsim/manifest/reference")]
    renderers = [
        name
        for name, text in _sources(wheel).items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef) and node.name in {"render_reference", "render_models"}
    ]
    assert renderers == []
    # ...and the checkout still has it, where `avsim manifest reference` finds it.
    assert (ROOT / "provider" / "avsim_docgen" / "manifest_reference.py").is_file()


def test_dev_tools_live_in_one_clearly_named_package(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for module in ("demo", "stack", "procwatch", "fakesim", "fakesim_artifacts"):
        assert f"{DEV}{module}.py" in names
        elsewhere = [n for n in names if n.endswith(f"/{module}.py") and not n.startswith(DEV)]
        assert elsewhere == [], f"{module} outside {DEV}: {elsewhere}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = wheel.read(entry_points).decode()
    assert "avsim-fakesim = avsim.devstack.fakesim:main" in scripts
    assert "avsim = avsim.cli:main" in scripts


def test_no_runtime_module_imports_the_dev_tools(wheel: zipfile.ZipFile) -> None:
    importers: dict[str, list[str]] = {}
    for name, text in _sources(wheel).items():
        if name.startswith(DEV) or not name.startswith("avsim/"):
            continue
        for node in ast.walk(ast.parse(text)):
            targets = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for target in targets:
                if target == "avsim.devstack" or target.startswith("avsim.devstack."):
                    importers.setdefault(name, []).append(target)
    assert importers == {"avsim/cli.py": ["avsim.devstack.demo"]}
