"""The "written by / read by" tables in the docstrings of avsim.contracts stay true.

Each module's table has a row for every contract a task hands on (a model no other contract of
the module nests); each row names a class of that module; and every module, function, class or
method a table names exists and mentions the contract, and every task id, XCom key or method it
quotes sits beside the contract's name in some module, so a rename fails here. The package's list
of the other modules names their contracts.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from avsim import contracts

MODULES = ("avsim.contracts", "avsim.contracts.case", "avsim.contracts.pod", "avsim.contracts.week")
_ROLE = re.compile(r":(mod|func|class|meth):`~?([^`]+)`")
_CHUNK = re.compile(r"\S+(?: \S+)*")  # a cell's text on one line: words one space apart


def _table(doc: str) -> list[list[str]]:
    """The table's rows as the text of each column, its lines joined. A column starts where a ``===``
    run of the rules starts (give or take two characters); a cell may run past it, two spaces or more
    before the next cell."""
    lines = doc.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("===")]
    assert len(rules) == 3, "a table of a header and a body between three ``===`` rules"
    starts = [m.start() for m in re.finditer("=+", lines[rules[0]])]
    rows: list[list[str]] = []
    for line in lines[rules[1] + 1 : rules[2]]:
        cells = [""] * len(starts)
        for chunk in _CHUNK.finditer(line):
            column = max(i for i, s in enumerate(starts) if s <= chunk.start() + 2)
            assert not cells[column], f"two cells in one column, one space apart? {line!r}"
            cells[column] = chunk.group()
        if cells[0]:
            rows.append(cells)
        else:
            assert rows, f"a continuation before any row: {line!r}"
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
    return rows


def _named(cell: str) -> list[tuple[str, str]]:
    """(role, dotted name) of each cross-reference in a cell, its line breaks taken out."""
    return [(role, re.sub(r"\s+", "", target)) for role, target in _ROLE.findall(cell)]


def _resolve(dotted: str) -> object:
    """The module, or the attribute of the longest importable module prefix, ``dotted`` names."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def _source(obj: object) -> str:
    """The source of a function, class or module; every module's of a package."""
    if isinstance(obj, types.ModuleType) and hasattr(obj, "__path__"):
        return "".join(p.read_text(encoding="utf-8") for p in Path(obj.__path__[0]).rglob("*.py"))
    return inspect.getsource(obj)  # type: ignore[arg-type]


def _models_of(module: types.ModuleType) -> tuple[set[str], set[str]]:
    """The public models a module defines, and those of them no other of its models holds in a field."""
    models = {
        name: cls
        for name, cls in vars(module).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseModel)
        and cls.__module__ == module.__name__
        and not name.startswith("_")
    }
    nested: set[str] = set()

    def walk(annotation: object) -> None:
        if inspect.isclass(annotation) and annotation.__name__ in models:
            nested.add(annotation.__name__)
        for arg in typing.get_args(annotation):
            walk(arg)

    for cls in models.values():
        for field in cls.model_fields.values():
            walk(field.annotation)
    return set(models), set(models) - nested


def _rows_named(module: types.ModuleType) -> set[str]:
    return {name for row in _table(module.__doc__ or "") for _, name in _named(row[0])}


@pytest.mark.parametrize("name", MODULES)
def test_each_contract_has_a_row_and_each_row_is_a_contract_of_the_module(name: str) -> None:
    module = importlib.import_module(name)
    rows = _rows_named(module)
    assert rows, f"{name}'s docstring has no row naming a :class:"
    models, handed_on = _models_of(module)
    assert rows <= models, f"{name}'s table names what is not one of its models: {sorted(rows - models)}"
    assert handed_on <= rows, f"{name}'s table has no row for {sorted(handed_on - rows)}"
    for row in _table(module.__doc__ or ""):
        assert row[1] and row[2], f"{name}: a row without its writer or reader: {row}"


@pytest.mark.parametrize("name", MODULES)
def test_every_writer_and_reader_a_table_names_exists_and_uses_the_contract(name: str) -> None:
    module = importlib.import_module(name)
    for contract, *sides in _table(module.__doc__ or ""):
        ((_, model),) = _named(contract)
        for role, dotted in (n for cell in sides for n in _named(cell)):
            obj = _resolve(dotted)  # a rename fails here: no such module or attribute
            if role == "mod":
                assert isinstance(obj, types.ModuleType), f"{dotted} is not a module"
            else:
                assert callable(obj), f":{role}:`{dotted}` is not a {role}"
            assert model in _source(obj), f"{dotted} is said to write or read {model}, but never names it"


@pytest.mark.parametrize("name", MODULES)
def test_every_task_xcom_key_or_method_a_table_names_is_where_the_contract_is(name: str) -> None:
    """A name in double backquotes (a task id, an XCom key, an argument, a method) is written in a
    module of avsim beside the contract's name: renaming ``load_shard`` or ``end_here`` fails here."""
    package = Path(contracts.__file__).parents[1]
    sources = [p.read_text(encoding="utf-8") for p in package.rglob("*.py") if "contracts" not in p.parts]
    module = importlib.import_module(name)
    for contract, *sides in _table(module.__doc__ or ""):
        ((_, model),) = _named(contract)
        for word in (w for cell in sides for w in re.findall(r"``([a-z_][a-z0-9_]*)``", cell)):
            assert any(
                re.search(rf"\b{word}\b", text) and re.search(rf"\b{model}\b", text) for text in sources
            ), f"{name}: no module of avsim names both ``{word}`` and {model}"


def test_the_package_lists_the_other_modules_contracts() -> None:
    bullets = re.findall(r"^\* :mod:`([\w.]+)`:(.*?)(?=^\* |^\S|\Z)", contracts.__doc__ or "", re.M | re.S)
    listed = {mod: set(re.findall(r"``([A-Z]\w+)``", text)) for mod, text in bullets}
    assert listed == {name: _rows_named(importlib.import_module(name)) for name in MODULES[1:]}


def test_the_table_parser_reads_a_cell_across_lines_and_past_its_column() -> None:
    doc = """
    ==========  ========  ========
    contract    written   read
    ==========  ========  ========
    :class:`Looooong`  :func:`a.  b
                b`        c
    ==========  ========  ========
    """
    (row,) = _table(inspect.cleandoc(doc))
    assert row == [":class:`Looooong`", ":func:`a. b`", "b c"]
    assert _named(row[1]) == [("func", "a.b")]
