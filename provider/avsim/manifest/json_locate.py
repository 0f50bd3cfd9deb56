"""Where the problems of a JSON document are: line, column and document path.

The loader parses with the C parser and runs this scanner only when it found what that parser accepts
and a manifest does not (duplicate keys, non-finite or too large numbers, nesting too deep). It is an
iterative tokenizer, linear in the text, with memory bounded by :data:`MAX_JSON_DEPTH`: a frame holds
its own key or index, a path is built only for a problem, and the scan stops at the first container
nested too deep. docs/design.md, "Validating a manifest in a bounded process".
"""

from __future__ import annotations

import math
import re
from typing import Any

from avsim.errors import Problem
from avsim.manifest.field_errors import format_path

#: Containers nested deeper than this are reported (the parser gives up far below Python's stack).
MAX_JSON_DEPTH = 200
#: Problems reported at most.
MAX_REPORTED = 200

_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"'  # a string
    r"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"  # a number
    r"|-?Infinity|NaN|true|false|null"
    r"|[{}\[\],:]"
    r"|[ \t\r\n]+",
    re.DOTALL,
)


class _Frame:
    __slots__ = ("index", "is_map", "key", "seen", "want_key")

    def __init__(self, is_map: bool) -> None:
        self.is_map = is_map
        self.seen: dict[str, int] = {}
        self.index = 0
        self.key: str | None = None
        self.want_key = is_map


def too_deep_message() -> str:
    return f"JSON nesting is too deep: more than {MAX_JSON_DEPTH} levels here (a fixed limit); flatten it"


def json_problems(text: str) -> list[Problem]:
    """Duplicate keys, non-finite numbers and too-deep nesting, each with line, column and path."""
    import json

    out: list[Problem] = []
    stack: list[_Frame] = []
    line, line_start, counted = 1, 0, 0

    def where(pos: int) -> tuple[int, int]:
        nonlocal line, line_start, counted
        newlines = text.count("\n", counted, pos)
        if newlines:
            line += newlines
            line_start = text.rfind("\n", counted, pos) + 1
        counted = pos
        return line, pos - line_start + 1

    def value_loc() -> tuple[Any, ...]:
        return tuple(f.key if f.is_map else f.index for f in stack)

    def add(loc: tuple[Any, ...], pos: int, message: str) -> None:
        if len(out) < MAX_REPORTED:
            ln, col = where(pos)
            out.append(Problem(format_path(loc), f"{message} (line {ln}, column {col})"))

    pos, end = 0, len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            break  # a syntax error: the parser reported it already
        tok, start, pos = m.group(), m.start(), m.end()
        first = tok[0]
        if first in " \t\r\n":
            continue
        top = stack[-1] if stack else None
        if top is not None and top.is_map and top.want_key:
            if first == '"':
                key = json.loads(tok)
                ln, _ = where(start)
                if key in top.seen:
                    first_ln = top.seen[key]
                    top.key = key
                    add(
                        value_loc(),
                        start,
                        f"duplicate key {key!r} in a JSON object (first at line {first_ln}); keep one of them",
                    )
                else:
                    top.seen[key] = ln
                top.key, top.want_key = key, False
            elif first == "}":
                stack.pop()
            continue
        if first in "{[":
            if len(stack) == MAX_JSON_DEPTH:
                # The container that opens level MAX_JSON_DEPTH + 1: its path is the limit's length.
                add(value_loc(), start, too_deep_message())
                return out
            stack.append(_Frame(first == "{"))
        elif first in "}]":
            if stack:
                stack.pop()
        elif first == ",":
            if top is not None:
                if top.is_map:
                    top.want_key = True
                else:
                    top.index += 1
        elif first == ":":
            continue
        elif tok in ("NaN", "Infinity", "-Infinity"):
            add(value_loc(), start, f"{tok} is not a JSON number; use a finite number")
        elif first in "-0123456789" and not math.isfinite(float(tok)):
            add(value_loc(), start, f"the number {tok[:40]} is too large for a float; use a finite number")
    return out
