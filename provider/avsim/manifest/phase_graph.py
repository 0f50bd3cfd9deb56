"""Dependency rules of a phase graph: unknown or repeated upstreams, self-dependencies and cycles.

Pure functions of a graph's shape (phase names and their ``depends_on`` entries), cached by shape,
so a 10,000-case manifest whose cases share a few graphs checks each graph once. Locations are
relative to the graph's phase mapping; :mod:`avsim.manifest.validation` roots them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from avsim.manifest.field_errors import Loc
from avsim.manifest.models import NAME_PATTERN

_NAME_RE = re.compile(NAME_PATTERN)


@lru_cache(maxsize=1024)
def dependency_problems(
    shape: tuple[tuple[Any, tuple[tuple[int, str], ...]], ...], kind: str
) -> tuple[tuple[Loc, str], ...]:
    names = [n for n, _ in shape if isinstance(n, str)]
    stripped = {n: n for n in names}
    listed = ", ".join(stripped) or "none"
    out: list[tuple[Loc, str]] = []
    deps: dict[str, list[str]] = {}
    for name, entries in shape:
        if not isinstance(name, str):
            continue
        ups: list[str] = []
        for k, raw in entries:
            up = raw
            if up == name:
                out.append(
                    ((name, "depends_on", k), f"{kind} {up!r} depends on itself; remove it from depends_on")
                )
            elif up in stripped:
                ups.append(up)
            elif _NAME_RE.match(up):
                close = difflib.get_close_matches(up, list(stripped), n=1)
                guess = f"did you mean {close[0]!r}?" if close else f"fix the name or add the {kind}"
                out.append(((name, "depends_on", k), f"unknown {kind} {up!r} (known: {listed}); {guess}"))
        deps[name] = ups
    for cycle in _cycles(deps):
        out.append(
            (
                (),
                f"{kind}s depend on each other in a cycle: {_show_cycle(cycle)}; "
                "break it by removing one of these depends_on entries",
            )
        )
    return tuple(out)


def _show_cycle(cycle: list[str], keep: int = 10) -> str:
    if len(cycle) <= 2 * keep + 1:
        return " -> ".join(cycle)
    hidden = len(cycle) - 2 * keep
    return " -> ".join([*cycle[:keep], f"... ({hidden} more)", *cycle[-keep:]])


def _cycles(deps: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """One cycle per strongly connected component, in run order (``a -> b``: b runs after a).

    Each cycle starts and ends at its earliest-declared phase. Iterative (Tarjan), so a long
    dependency chain cannot exhaust the interpreter stack.
    """
    order = {name: k for k, name in enumerate(deps)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in deps:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, pos = work.pop()
            if pos == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            ups = deps.get(node, ())
            if pos < len(ups):
                work.append((node, pos + 1))
                up = ups[pos]
                if up not in index:
                    work.append((up, 0))
                elif up in on_stack:
                    low[node] = min(low[node], index[up])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    cycles = [_cycle_in(sorted(c, key=order.__getitem__), deps) for c in components]
    return sorted(cycles, key=lambda c: order[c[0]])


def _cycle_in(members: list[str], deps: Mapping[str, Sequence[str]]) -> list[str]:
    """The shortest cycle through ``members[0]`` inside one strongly connected component."""
    start, inside = members[0], set(members)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for node in frontier:
            for up in deps.get(node, ()):
                if up == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    # path runs from the dependant back to start along depends_on edges; in run order
                    # every phase comes after the one it depends on.
                    return [start, *path[:-1], start]
                if up in inside and up not in came_from and up != start:
                    came_from[up] = node
                    nxt.append(up)
        frontier = nxt
    return [*members, members[0]]  # unreachable for a real component
