"""The packages of avsim form the layers docs/design.md declares: no import reaches a higher layer,
no import cycle between them, and no private name crosses one.

The graph is read from the source (an AST walk, nothing is imported): a node is a subpackage
(``avsim.manifest``) or a top-level module (``avsim.settings``) of ``provider/avsim``, and an edge is
any ``import``/``from ... import`` of another node anywhere in a file, inside functions too (a
deferred import is still a dependency), except under ``if TYPE_CHECKING:`` (annotations only).
The order is read from docs/design.md ("**Layers.**"): its numbered list, bottom first, names each
node once in backticks (names inside parentheses are commentary); "then" orders the nodes of one
layer. Every node of the tree must be in the list, and every name of the list in the tree.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provider" / "avsim"
DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


@dataclass(frozen=True)
class Import:
    source: str  # importing node
    target: str  # imported node
    where: str  # file:line
    text: str  # the statement
    names: tuple[str, ...]  # what a ``from`` import takes

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(root: Path, module: str) -> str:
    """``avsim.x.y`` -> ``x``; ``avsim`` itself -> ``avsim``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except in the body of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]))
            else:
                walk(child)

    walk(tree)
    return found


def imports(root: Path = PACKAGE) -> list[Import]:
    """Every import of one node of the package ``root`` by another."""
    top = root.name
    out: list[Import] = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = _node(root, module)
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for stmt in _statements(ast.parse(text, filename=str(path))):
            if isinstance(stmt, ast.Import):
                targets = [(a.name, ()) for a in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                    base = ".".join([*anchor, *([stmt.module] if stmt.module else [])])
                names = tuple(a.name for a in stmt.names)
                # ``from avsim import x``: x is a module or a subpackage
                targets = [(f"{top}.{n}", ()) for n in names] if base == top else [(base, names)]
            for target, names in targets:
                if target != top and not target.startswith(f"{top}."):
                    continue
                node = _node(root, target)
                if node != source:
                    where = f"{path.relative_to(root.parent)}:{stmt.lineno}"
                    out.append(Import(source, node, where, lines[stmt.lineno - 1].strip(), names))
    return out


@dataclass(frozen=True)
class Cycle:
    path: list[Import]  # a shortest cycle through the group's first node
    within: list[Import]  # every import between two nodes of the group: what to untangle

    def __str__(self) -> str:
        chain = " -> ".join([self.path[0].source, *(imp.target for imp in self.path)])
        lines = [chain, *(f"    {imp}" for imp in self.path)]
        rest = [imp for imp in self.within if imp not in self.path]
        if rest:
            lines += ["  and every other import within the group:", *(f"    {imp}" for imp in rest)]
        return "\n".join(lines)


def cycles(found: list[Import]) -> list[Cycle]:
    """One :class:`Cycle` per strongly connected group of nodes (none when the graph is acyclic)."""
    graph: dict[str, set[str]] = defaultdict(set)
    first: dict[tuple[str, str], Import] = {}
    for imp in found:
        graph[imp.source].add(imp.target)
        first.setdefault((imp.source, imp.target), imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for group in groups:  # the shortest way back to the group's first node, through the group
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        closed: list[str] | None = None
        while frontier and closed is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w == start:
                        closed = [*paths[v], start]
                        break
                    if w not in paths:
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
                if closed:
                    break
            frontier = nxt
        assert closed is not None
        within = [imp for imp in found if imp.source in group and imp.target in group]
        out.append(Cycle([first[(a, b)] for a, b in itertools.pairwise(closed)], within))
    return out


Rank = tuple[int, int]  # (layer, step of the layer's "then" order); a node may import ranks <= its own


def declared_layers(text: str) -> dict[str, Rank]:
    """Node -> rank, from the numbered list after ``**Layers.**`` in ``text`` (docs/design.md)."""
    start = text.index("**Layers.**")
    end = text.find("\n## ", start)
    block = text[start : end if end >= 0 else len(text)]
    items = re.findall(r"^(\d+)\.\s(.*?)(?=^\d+\.\s|^\S|\Z)", block, re.S | re.M)
    assert items, "no numbered list after **Layers.**"
    ranks: dict[str, Rank] = {}
    for number, body in items:
        depth, kept = 0, []
        for ch in body:  # what is inside parentheses is commentary
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and ch != ")":
                kept.append(ch)
        step = 0
        for m in re.finditer(r"`([A-Za-z_]\w*)`|\bthen\b", "".join(kept)):
            if m.group(1) is None:
                step += 1
            else:
                assert m.group(1) not in ranks, f"{m.group(1)} is listed twice"
                ranks[m.group(1)] = (int(number), step)
    return ranks


def tree_nodes(root: Path = PACKAGE) -> set[str]:
    """Every top-level module and subpackage (namespace packages too) of the package ``root``; the
    package itself is none (its ``__init__`` is empty: importing ``avsim`` alone takes no layer)."""
    modules = {p.stem for p in root.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name for p in root.iterdir() if p.is_dir() and any(p.rglob("*.py"))}


def _rank_text(node: str, rank: Rank) -> str:
    return f"{node} (layer {rank[0]}{f', then-step {rank[1]}' if rank[1] else ''})"


def upward(found: list[Import], ranks: dict[str, Rank], package: str = PACKAGE.name) -> list[str]:
    """Every import of a node ranked above the importer, and every import by or of an unlisted node.
    The package itself ranks below every layer: ``import avsim`` takes nothing, and its ``__init__``
    may import nothing of avsim."""
    ranks = {package: (0, 0), **ranks}
    out = []
    for imp in found:
        unlisted = [n for n in (imp.source, imp.target) if n not in ranks]
        if unlisted:
            out.append(f"{imp}  ({', '.join(unlisted)} not in the layer list)")
        elif ranks[imp.target] > ranks[imp.source]:
            src, dst = _rank_text(imp.source, ranks[imp.source]), _rank_text(imp.target, ranks[imp.target])
            out.append(f"{imp}  ({src} imports {dst})")
    return out


# ------------------------------------------------------------------------------------------ avsim


def test_no_import_cycle_between_avsims_packages() -> None:
    found = cycles(imports())
    assert not found, "import cycles between avsim's packages:\n" + "\n".join(map(str, found))


def test_no_private_name_is_imported_from_another_package() -> None:
    private = [
        str(imp)
        for imp in imports()
        for name in imp.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert private == [], "make them public or keep them in their package:\n" + "\n".join(private)


def test_the_graph_sees_avsims_real_dependencies() -> None:
    """The walk is not vacuous: known edges, module-level and deferred, are in it."""
    edges = {(imp.source, imp.target) for imp in imports()}
    assert ("operators", "kube") in edges and ("dagbuild", "operators") in edges
    assert ("cli", "devstack") in edges  # deferred: inside the demo command
    assert ("manifest", "phases") in edges  # deferred: inside a validator
    assert not {e for e in edges if e[1] == "devstack" and e[0] != "cli"}, "only the demo command"


def test_every_node_is_in_the_declared_layers_and_every_listed_name_exists() -> None:
    ranks, nodes = declared_layers(DESIGN.read_text(encoding="utf-8")), tree_nodes()
    missing, gone = sorted(nodes - ranks.keys()), sorted(ranks.keys() - nodes)
    assert not missing, f"add to docs/design.md's layer list: {missing}"
    assert not gone, f"listed in docs/design.md's layers but not in provider/avsim: {gone}"


def test_no_import_reaches_a_higher_layer() -> None:
    found = upward(imports(), declared_layers(DESIGN.read_text(encoding="utf-8")))
    assert not found, "imports against docs/design.md's layer order:\n" + "\n".join(found)


def test_the_declared_order_is_read_as_written() -> None:
    """The parse is not vacuous: the design's list gives the ranks its text says."""
    ranks = declared_layers(DESIGN.read_text(encoding="utf-8"))
    assert ranks["errors"] == ranks["hooks"] == (1, 0)
    assert ranks["ui"][0] == 4 and ranks["links"][0] < 4  # the operators' link is below the pages
    assert ranks["report"] < ranks["triage"] < ranks["ui"] and ranks["triage"][0] == ranks["plan"][0]
    assert ranks["operators"] < ranks["sensors"] < ranks["dagbuild"] < ranks["plugin"]
    assert ranks["sensors"][0] == 5 and ranks["cli"][0] == ranks["devstack"][0] == 6
    assert "source" not in ranks and "manifest.source" not in ranks  # commentary in parentheses


# ------------------------------------------------------------------------------------------ the walk


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_cycle_is_named_with_the_import_lines_that_make_it(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/x.py": "from pkg.b.y import thing\n",
            "b/__init__.py": "",
            "b/y.py": "def f():\n    from pkg import c\n",
            "c.py": "import pkg.a.x\n",
            "d.py": "from pkg.a import x\n",  # into the cycle, not part of it
        },
    )
    [cycle] = cycles(imports(root))
    assert str(cycle) == (
        "a -> b -> c -> a\n"
        "    pkg/a/x.py:1: from pkg.b.y import thing\n"
        "    pkg/b/y.py:2: from pkg import c\n"
        "    pkg/c.py:1: import pkg.a.x"
    )
    # A shorter way round is named first; the rest of the group's imports are listed too.
    (root / "b" / "z.py").write_text("def g():\n    if True:\n        import pkg.a\n", encoding="utf-8")
    [cycle] = cycles(imports(root))
    assert str(cycle) == (
        "a -> b -> a\n"
        "    pkg/a/x.py:1: from pkg.b.y import thing\n"
        "    pkg/b/z.py:3: import pkg.a\n"
        "  and every other import within the group:\n"
        "    pkg/b/y.py:2: from pkg import c\n"
        "    pkg/c.py:1: import pkg.a.x"
    )


def test_type_checking_imports_and_imports_within_a_package_are_no_edges(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "a/__init__.py": "from pkg.a import inner\n",
            "a/inner.py": "from . import __name__ as n\nfrom typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.b import y\nelse:\n    import json\n",
            "b/__init__.py": "",
            "b/y.py": "from ..a.inner import n\n",  # relative, into another package
        },
    )
    found = imports(root)
    assert [(i.source, i.target, i.where) for i in found] == [("b", "a", "pkg/b/y.py:1")]
    assert cycles(found) == []


@pytest.mark.parametrize("guard", ["TYPE_CHECKING", "typing.TYPE_CHECKING"])
def test_both_spellings_of_the_type_checking_guard(tmp_path: Path, guard: str) -> None:
    root = _package(
        tmp_path, {"a.py": f"import typing\nif {guard}:\n    import pkg.b\n", "b.py": "import pkg.a\n"}
    )
    assert cycles(imports(root)) == []


LAYERS = """**Layers.** From the bottom:

1. `low` (imports nothing; not `high`), `twin`;
2. `high`, then `later`
   (a name in parentheses is no node: `low`).

## Next
1. `elsewhere`
"""


def test_the_layer_list_is_parsed_with_its_then_order() -> None:
    assert declared_layers(LAYERS) == {"low": (1, 0), "twin": (1, 0), "high": (2, 0), "later": (2, 1)}


def test_an_upward_import_is_named_with_its_line(tmp_path: Path) -> None:
    files = {
        "low.py": "import json\n\ndef f():\n    from pkg.high import thing\n",  # deferred: still an edge
        "twin.py": "import pkg\nfrom pkg import low\n",  # the package itself, the same layer: allowed
        "high.py": "from pkg.low import f\nfrom pkg.later import g\n",  # a later step of its layer
        "later.py": "import pkg.high\nimport pkg.twin\n",  # an earlier step, a lower layer: allowed
    }
    root = _package(tmp_path, files)
    assert tree_nodes(root) == {"low", "twin", "high", "later"}
    assert upward(imports(root), declared_layers(LAYERS), "pkg") == [
        "pkg/high.py:2: from pkg.later import g  (high (layer 2) imports later (layer 2, then-step 1))",
        "pkg/low.py:4: from pkg.high import thing  (low (layer 1) imports high (layer 2))",
    ]
    (root / "__init__.py").write_text("from pkg import twin\n", encoding="utf-8")  # the package's own init
    assert upward(imports(root), declared_layers(LAYERS), "pkg")[0] == (
        "pkg/__init__.py:1: from pkg import twin  (pkg (layer 0) imports twin (layer 1))"
    )
    (root / "__init__.py").write_text("", encoding="utf-8")
    (root / "extra").mkdir()
    (root / "extra" / "__init__.py").write_text("from pkg import low\n", encoding="utf-8")
    assert tree_nodes(root) - declared_layers(LAYERS).keys() == {"extra"}
    assert upward(imports(root), declared_layers(LAYERS), "pkg")[0] == (
        "pkg/extra/__init__.py:1: from pkg import low  (extra not in the layer list)"
    )
