"""Every private member of Airflow, its providers or the Kubernetes client that avsim touches is reached
through ``avsim.airflow_internals``, and ``tests/unit/test_airflow_internals*.py`` pins each one.

The source is read, not trusted: an AST walk of every file of ``provider/avsim`` but
``airflow_internals.py`` finds each *touch* of a private name (``_x``; dunders are public):

- an import of a private name, or from a private module, of ``airflow``/``kubernetes*``;
- ``self._x``, ``cls._x``, ``super()._x`` or ``getattr(self, "_x")`` in a class of avsim, when ``_x``
  is a member of one of the class's bases from outside avsim (its attributes and annotations, and
  what its source assigns to ``self._x``): the class is imported to read its MRO;
- ``y._x`` or ``getattr(y, "_x")`` on anything else, when ``y`` is a name bound by an import from
  ``airflow``/``kubernetes*``, or when no code of avsim defines ``_x`` (a private def, class or
  module name, a class attribute, or a ``self._x =`` of a class with no outside base defining it).
  What avsim defines itself is its own: the walk cannot tell the type of ``y``, so an outside
  member that happens to share an own name goes unseen (say so here when one is found).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provider" / "avsim"
INTERNALS = "airflow_internals.py"
FOREIGN = ("airflow", "kubernetes", "kubernetes_asyncio")


def _private(name: str) -> bool:
    return (
        name.startswith("_") and name.strip("_") != "" and not (name.startswith("__") and name.endswith("__"))
    )


def _outside(module: str, foreign: tuple[str, ...]) -> bool:
    return module.split(".")[0] in foreign


@dataclass(frozen=True)
class Touch:
    path: str  # relative to the package's parent
    line: int
    name: str
    text: str  # what touches it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@dataclass
class _Scan:
    """What one walk of a package's files found."""

    own: set[str] = field(default_factory=set)  # private names avsim defines
    imports: list[Touch] = field(default_factory=list)  # private imports from outside
    members: list[tuple[str, str, Touch, bool]] = field(default_factory=list)  # (module, class, touch, store)
    others: list[tuple[bool, Touch]] = field(default_factory=list)  # (on an outside import?, touch)


def _stores(tree: ast.AST) -> Iterator[str]:
    """Names assigned as ``self._x`` anywhere in ``tree``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            yield node.attr


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    return []


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_by_outside_imports(tree: ast.AST, foreign: tuple[str, ...]) -> set[str]:
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names if _outside(a.name, foreign)}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and _outside(node.module, foreign)
        ):
            bound |= {a.asname or a.name for a in node.names}
    return bound


def _private_imports(node: ast.Import | ast.ImportFrom, foreign: tuple[str, ...]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if _outside(a.name, foreign)]
        return [n for n in names if any(_private(p) for p in n.split("."))]
    if node.module and not node.level and _outside(node.module, foreign):
        in_path = any(_private(p) for p in node.module.split("."))
        return [a.name for a in node.names if in_path or _private(a.name)]
    return []


def _private_access(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``y._x`` or ``getattr(y, "_x")`` (has-, set-, del-): ``(y, "_x")``."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        return node.value, node.attr
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and _private(node.args[1].value)
    ):
        return node.args[0], node.args[1].value
    return None


def _own_definitions(tree: ast.AST) -> set[str]:
    """Private defs and classes anywhere, and private names assigned in a module's or a class's body."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(node.name):
            found.add(node.name)
        if isinstance(node, ast.Module | ast.ClassDef):
            found |= {t.id for stmt in node.body for t in _targets(stmt) if isinstance(t, ast.Name)}
    return {n for n in found if _private(n)}


def _scan_file(scan: _Scan, root: Path, path: Path, foreign: tuple[str, ...]) -> None:
    rel = path.relative_to(root.parent)
    parts = rel.with_suffix("").parts
    module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    scan.own |= _own_definitions(tree)
    bound = _bound_by_outside_imports(tree, foreign)

    def touch(node: ast.AST, name: str) -> Touch:
        line = getattr(node, "lineno", 0)
        return Touch(str(rel), line, name, lines[line - 1].strip())

    def walk(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                scan.imports += [touch(child, name) for name in _private_imports(child, foreign)]
            access = _private_access(child)
            if access is not None:
                receiver, name = access
                if cls is not None and _is_self(receiver):
                    store = isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store)
                    scan.members.append((module, cls, touch(child, name), store))
                else:
                    scan.others.append((_root_name(receiver) in bound, touch(child, name)))
            inner = (f"{cls}.{child.name}" if cls else child.name) if isinstance(child, ast.ClassDef) else cls
            walk(child, inner)

    walk(tree, None)


def _scan(root: Path, foreign: tuple[str, ...]) -> _Scan:
    scan = _Scan()
    for path in sorted(root.rglob("*.py")):
        if str(path.relative_to(root)) == INTERNALS:
            scan.own |= _own_definitions(ast.parse(path.read_text(encoding="utf-8")))
        else:
            _scan_file(scan, root, path, foreign)
    return scan


def outside_members(klass: type, package: str) -> set[str]:
    """The private members of ``klass``'s bases from outside ``package``: attributes, annotations and
    what their source assigns to ``self._x``."""
    found: set[str] = set()
    for base in klass.__mro__:
        if base is object or base.__module__.split(".")[0] == package:
            continue
        found |= {n for n in vars(base) if _private(n)}
        found |= {n for n in vars(base).get("__annotations__", {}) if _private(n)}
        with contextlib.suppress(OSError, TypeError):  # no Python source (builtins, C extensions)
            found |= {n for n in _stores(ast.parse(textwrap.dedent(inspect.getsource(base)))) if _private(n)}
    return found


def touches(root: Path = PACKAGE, foreign: tuple[str, ...] = FOREIGN) -> list[Touch]:
    """Every touch of an outside private member in the package ``root`` (importable), but in its
    ``airflow_internals.py``."""
    scan = _scan(root, foreign)
    found = list(scan.imports)
    classes: dict[tuple[str, str], set[str]] = {}
    for module, qualname, hit, _ in scan.members:
        if (module, qualname) not in classes:
            klass: object = importlib.import_module(module)
            for part in qualname.split("."):
                klass = getattr(klass, part, None)
            assert isinstance(klass, type), f"{hit.path}: cannot import class {qualname} to read its bases"
            classes[(module, qualname)] = outside_members(klass, root.name)
        if hit.name in classes[(module, qualname)]:
            found.append(hit)
    # A name stored on self is avsim's own unless an outside base of that class has it.
    own = scan.own | {
        hit.name
        for module, qualname, hit, store in scan.members
        if store and hit.name not in classes[(module, qualname)]
    }
    found += [hit for on_import, hit in scan.others if on_import or hit.name not in own]
    return sorted(found, key=lambda t: (t.path, t.line, t.name))


def touched_by_internals(root: Path = PACKAGE) -> set[str]:
    """The private names of others that airflow_internals.py touches: attribute names, getattr names
    and private parts of the modules it imports, less the names it defines itself."""
    tree = ast.parse((root / INTERNALS).read_text(encoding="utf-8"))
    return _private_names(tree) - _own_definitions(tree)


def _private_names(tree: ast.AST) -> set[str]:
    """Every private name in ``tree``: attributes, string constants, imported names and module parts."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
        elif isinstance(node, ast.Import):
            found |= {p for a in node.names for p in a.name.split(".")}
        elif isinstance(node, ast.ImportFrom):
            found |= {*(node.module or "").split("."), *(a.name for a in node.names)}
    return {n for n in found if n.isidentifier() and _private(n)}


# ------------------------------------------------------------------------------------------ avsim


def test_no_private_airflow_or_kubernetes_member_is_touched_outside_airflow_internals() -> None:
    found = [str(t) for t in touches()]
    assert not found, "reach these through avsim.airflow_internals (with a test there):\n" + "\n".join(found)


def test_every_private_member_airflow_internals_touches_is_pinned_by_its_tests() -> None:
    names = touched_by_internals()
    assert {"_config_dict", "_factory", "_shared", "_get_ti_pod_labels", "_killed"} <= names  # not vacuous
    tests = Path(__file__).resolve().parent.glob("test_airflow_internals*.py")
    pinned = set().union(*(_private_names(ast.parse(p.read_text(encoding="utf-8"))) for p in tests))
    missing = sorted(names - pinned)
    assert not missing, (
        f"airflow_internals touches these; pin each in tests/unit/test_airflow_internals*.py: {missing}"
    )


# ------------------------------------------------------------------------------------------ the walk


VENDOR = """
class Base:
    _flag = False

    def __init__(self):
        self._state = 1

    def _hook(self):
        return self._state

    def public(self):
        return 1


def _helper():
    return 2
"""

MINE = """
import vendor
from vendor import Base
from vendor import _helper


class Mine(Base):
    _own = 0

    def __init__(self):
        super().__init__()
        self._mine = 2

    def run(self, other):
        self._own, self._mine = self.public(), self._hook()
        other._mine = getattr(self, "_state")
        vendor.Base._flag = True
        return other._unknown, Base()._own, _helper()


def _local(x):
    return x._own, x._mine
"""


def test_the_walk_names_every_kind_of_touch_and_leaves_own_members_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vendor.py").write_text(VENDOR, encoding="utf-8")
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("", encoding="utf-8")
    (root / "mine.py").write_text(MINE, encoding="utf-8")
    internals = (
        "import vendor\n_lock = 1\n\ndef _made(op):\n    return getattr(op, '_flag'), vendor.Base()._state\n"
    )
    (root / INTERNALS).write_text(internals, encoding="utf-8")  # allowed here, and what its tests must pin
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("vendor", "pkg", "pkg.mine"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert [(t.line, t.name) for t in touches(root, foreign=("vendor",))] == [
        (4, "_helper"),  # a private import
        (15, "_hook"),  # the base's private method, on self
        (16, "_state"),  # the base's attribute through getattr on self
        (17, "_flag"),  # on a name bound by an outside import
        (18, "_unknown"),  # defined nowhere in the package
    ]
    assert str(touches(root, foreign=("vendor",))[0]) == "pkg/mine.py:4: from vendor import _helper"
    assert touched_by_internals(root) == {"_flag", "_state"}  # not its own _lock and _made
