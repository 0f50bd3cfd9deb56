"""Cheap structural limits, checked before anything is built from a manifest.

Nesting depth (:data:`MAX_DEPTH`, fixed) and the case count (``[avsim] max_manifest_cases``), so a
document they refuse costs no node graph and no models. JSON is checked on the parsed document, YAML on
the parser's event stream before its node graph is composed; each walk keeps O(depth) state.
docs/design.md, "Validating a manifest in a bounded process".
"""

from __future__ import annotations

from typing import Any

from avsim.errors import Problem
from avsim.manifest.field_errors import format_path
from avsim.manifest.json_locate import MAX_JSON_DEPTH, json_problems, too_deep_message

#: Levels of mappings and lists a manifest may nest (JSON and YAML alike).
MAX_DEPTH = MAX_JSON_DEPTH


def too_many_cases(count: int | str, max_cases: int) -> str:
    return (
        f"{count} cases, the limit is {max_cases}; split the week into several manifests or raise "
        "[avsim] max_manifest_cases"
    )


def json_structure_problems(data: Any, text: str, max_cases: int | None) -> list[Problem]:
    """The case count and the nesting depth of a parsed JSON document (linear, O(depth) memory)."""
    cases = data.get("cases") if isinstance(data, dict) else None
    if max_cases is not None and isinstance(cases, list) and len(cases) > max_cases:
        return [Problem("cases", too_many_cases(len(cases), max_cases))]
    # Iterative, depth first; an entry is (container, depth, its key or index, its parent's entry),
    # so that only the path of the container too deep is ever built.
    stack: list[tuple[Any, int, Any, Any]] = [(data, 1, None, None)]
    while stack:
        entry = stack.pop()
        node, depth = entry[0], entry[1]
        if depth > MAX_DEPTH:
            # The scanner gives the line and column (and stops there: linear, bounded).
            located = [p for p in json_problems(text) if "nesting is too deep" in p.message]
            return located or [Problem(format_path(_loc(entry)), too_deep_message())]
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, dict | list):
                stack.append((value, depth + 1, key, entry))
    return []


def _loc(entry: Any) -> tuple[Any, ...]:
    segments = []
    while entry is not None and entry[3] is not None:
        segments.append(entry[2])
        entry = entry[3]
    return tuple(reversed(segments))


class _Frame:
    __slots__ = ("count", "is_map", "key", "want_key")

    def __init__(self, is_map: bool) -> None:
        self.is_map = is_map
        self.want_key = is_map
        self.key: Any = None
        self.count = 0  # items of a list, entries of a mapping


def yaml_structure_problems(text: str, max_cases: int | None) -> list[Problem]:
    """The nesting depth and the case count of a YAML document, from its events (nothing composed).

    A syntax error is left to the parser that composes the document (it reports it with its line)."""
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    stack: list[_Frame] = []
    cases = 0
    start_kinds = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
    end_kinds = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
    node_kinds = (yaml.ScalarEvent, yaml.AliasEvent, *start_kinds)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, node_kinds) and stack:
                top = stack[-1]
                if not top.is_map:
                    top.key = top.count
                    top.count += 1
                    if len(stack) == 2 and stack[0].key == "cases":
                        cases += 1
                elif top.want_key:
                    top.key = event.value if isinstance(event, yaml.ScalarEvent) else "?"
            if isinstance(event, start_kinds):
                if len(stack) == MAX_DEPTH:
                    mark = event.start_mark
                    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
                    path = format_path(_yaml_loc(stack))
                    return [
                        Problem(
                            path,
                            f"YAML nesting is too deep: more than {MAX_DEPTH} levels here (a fixed limit); "
                            f"flatten it{where}",
                        )
                    ]
                stack.append(_Frame(isinstance(event, yaml.MappingStartEvent)))
                continue
            if isinstance(event, end_kinds):
                stack.pop()
            if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, *end_kinds)) and stack:
                top = stack[-1]
                if top.is_map:  # a key or a value ended: the next node is the other one
                    top.want_key = not top.want_key
    except yaml.YAMLError:
        return []
    finally:
        loader.dispose()
    if max_cases is not None and cases > max_cases:
        return [Problem("cases", too_many_cases(cases, max_cases))]
    return []


def _yaml_loc(stack: list[_Frame]) -> tuple[Any, ...]:
    return tuple(f.key for f in stack)
