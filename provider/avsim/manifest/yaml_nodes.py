"""Checks on a YAML document's node graph, before any Python object is built from it.

Each problem names the document path and the line: duplicate mapping keys, aliases that expand too far
or recurse, a mapping key that is a list or a mapping, a YAML 1.1 reading that would change a value
(``yes``, ``0755``, ``1_000``, ``.nan``, a date other than ``run.deadline``) and explicit tags.
docs/security.md, "The manifest" (*Exactly what it says*).
"""

from __future__ import annotations

import re
from typing import Any

from avsim.errors import Problem
from avsim.manifest.field_errors import format_path

#: Alias expansion bound: expanded nodes <= max(factor * written nodes, MIN_EXPANSION_LIMIT).
MAX_EXPANSION_FACTOR = 10
MIN_EXPANSION_LIMIT = 1_000_000
#: Problems of one kind reported at most (the document is rejected anyway).
MAX_REPORTED = 200
#: Where a plain date-time is what the manifest means.
DATETIME_PATHS = frozenset({("run", "deadline")})

_Y = "tag:yaml.org,2002:"
_PLAIN_INT = re.compile(r"^-?(0|[1-9][0-9]*)$")
_PLAIN_FLOAT = re.compile(r"^-?[0-9]+\.[0-9]*([eE][-+][0-9]+)?$|^-?\.[0-9]+([eE][-+][0-9]+)?$")
#: Python refuses to convert longer integer text (sys.get_int_max_str_digits()).
MAX_INT_DIGITS = 4300
_PLAIN_BOOL = frozenset({"true", "True", "TRUE", "false", "False", "FALSE"})


def check_nodes(root: Any, resolve: Any) -> list[Problem]:
    """Every problem of the node graph under ``root``; ``resolve`` is the loader's tag resolver."""
    import yaml

    problems: list[Problem] = []
    written = 0  # distinct nodes
    expanded: dict[int, int] = {}  # node id -> expanded size
    in_progress: set[int] = set()
    # Iterative post-order walk; a node reached again through an alias is counted once as written
    # and its expanded size is reused.
    stack: list[tuple[Any, tuple[Any, ...], bool]] = [(root, (), False)]
    while stack:
        node, loc, done = stack.pop()
        nid = id(node)
        if done:
            in_progress.discard(nid)
            size = 1
            if isinstance(node, yaml.MappingNode):
                size += sum(expanded[id(k)] + expanded[id(v)] for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                size += sum(expanded[id(v)] for v in node.value)
            expanded[nid] = size
            continue
        if nid in expanded:
            continue
        if nid in in_progress:
            mark = node.start_mark
            return [Problem(format_path(loc), f"recursive YAML alias at line {mark.line + 1}; remove it")]
        written += 1
        in_progress.add(nid)
        stack.append((node, loc, True))
        if len(problems) < MAX_REPORTED:
            bad = _value_problem(node, loc, resolve)
            if bad:
                problems.append(Problem(format_path(loc), bad))
        if isinstance(node, yaml.MappingNode):
            _mapping(node, loc, problems, stack)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                stack.append((v, (*loc, i), False))
    limit = max(MAX_EXPANSION_FACTOR * written, MIN_EXPANSION_LIMIT)
    total = expanded[id(root)]
    if total > limit:
        problems.append(
            Problem(
                "",
                f"YAML aliases expand {written} written nodes to {total} (the limit is {limit}) from line "
                f"{root.start_mark.line + 1} on; write the repeated parts out or use fewer nested aliases",
            )
        )
    return problems


def _mapping(node: Any, loc: tuple[Any, ...], problems: list[Problem], stack: list[Any]) -> None:
    import yaml

    seen: dict[Any, int] = {}
    for k, v in node.value:
        line = k.start_mark.line + 1
        key = k.value if isinstance(k, yaml.ScalarNode) else None
        if key is None and len(problems) < MAX_REPORTED:
            kind = "list" if isinstance(k, yaml.SequenceNode) else "mapping"
            problems.append(
                Problem(
                    format_path(loc),
                    f"a key at line {line}, column {k.start_mark.column + 1} is a {kind}; a mapping key is a "
                    "plain name: write it as text",
                )
            )
        if key is not None and k.tag != _Y + "merge":
            if key in seen and len(problems) < MAX_REPORTED:
                problems.append(
                    Problem(
                        format_path((*loc, key)),
                        f"duplicate key {key!r} at line {line} (first at line {seen[key]}); keep one of them",
                    )
                )
            seen.setdefault(key, line)
        stack.append((v, (*loc, key if key is not None else "?"), False))
        # A key's own value checks (a tag, a 1.1 number) are reported at the mapping holding it.
        stack.append((k, (*loc, key) if key is not None else loc, False))


def _value_problem(node: Any, loc: tuple[Any, ...], resolve: Any) -> str | None:
    import yaml

    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        plain = node.style in (None, "")
        implicit = resolve(yaml.ScalarNode, node.value, (True, False)) if plain else _Y + "str"
        if node.tag != implicit and not (node.tag == _Y + "str" and not plain):
            return _explicit_tag(node.tag, line)
        if not plain:
            return None
        return _plain_problem(node.tag, node.value, loc, line)
    default = _Y + ("map" if isinstance(node, yaml.MappingNode) else "seq")
    if node.tag != default:
        return _explicit_tag(node.tag, line)
    return None


def _explicit_tag(tag: str, line: int) -> str:
    shown = tag.replace(_Y, "!!")
    return (
        f"explicit YAML tag {shown} at line {line}; a manifest is plain data: write the value without the "
        "tag (quote it to keep it as text)"
    )


def _plain_problem(tag: str, text: str, loc: tuple[Any, ...], line: int) -> str | None:
    keep = f"quote it ('{text}') to keep the text"
    if tag == _Y + "bool" and text not in _PLAIN_BOOL:
        word = "true" if text.lower() in ("yes", "on", "y") else "false"
        return (
            f"the plain word {text!r} at line {line} is read by YAML 1.1 as {word}; write {word}, or {keep}"
        )
    if tag == _Y + "int" and len(text) > MAX_INT_DIGITS:
        return (
            f"the number at line {line} has {len(text)} digits (at most {MAX_INT_DIGITS}); quote it to keep "
            "the text"
        )
    if tag == _Y + "int" and not _PLAIN_INT.match(text):
        return (
            f"the plain value {text!r} at line {line} is read by YAML 1.1 as a number other than it reads "
            f"(octal, hexadecimal, binary, '_' or ':' forms); write the number in decimal, or {keep}"
        )
    if tag == _Y + "float":
        if text.lower().lstrip("+-") in (".inf", ".nan"):
            return f"{text!r} at line {line} is not a finite number; write a finite number, or {keep}"
        if not _PLAIN_FLOAT.match(text):
            return (
                f"the plain value {text!r} at line {line} is read by YAML 1.1 as a number other than it "
                f"reads; write it like 1.5 or 2.0e+3, or {keep}"
            )
    if tag == _Y + "timestamp":
        if tuple(loc) not in DATETIME_PATHS:
            return f"the plain value {text!r} at line {line} is read by YAML as a date; {keep}"
        return _impossible_date(text, line)
    return None


def _impossible_date(text: str, line: int) -> str | None:
    import yaml

    try:
        yaml.constructor.SafeConstructor().construct_yaml_timestamp(yaml.ScalarNode(_Y + "timestamp", text))
    except ValueError as exc:
        return f"{text!r} at line {line} is no date-time ({exc}); write it like '2026-12-06T18:00:00Z'"
    return None
