"""Small graph algorithms over phase dependency maps (name -> upstream names)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class CycleError(ValueError):
    """The phases depend on each other in a cycle; ``cycle`` lists it, first name repeated last."""

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = tuple(cycle)
        super().__init__(" -> ".join(self.cycle))


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return one dependency cycle as ``[a, b, ..., a]``, or None. Unknown names are ignored."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(deps, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for up in deps.get(node, ()):
            if up not in color:
                continue
            if color[up] == grey:
                return [*stack[stack.index(up) :], up]
            if color[up] == white:
                found = visit(up)
                if found:
                    return found
        stack.pop()
        color[node] = black
        return None

    for name in deps:
        if color[name] == white:
            found = visit(name)
            if found:
                # Report in dependency direction: a -> b means a depends on b; show the flow order.
                return list(reversed(found))
    return None


def topological_order(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Names ordered so that every name comes after its upstreams; ties keep declaration order."""
    cycle = find_cycle(deps)
    if cycle:
        raise CycleError(cycle)
    order: list[str] = []
    done: set[str] = set()
    remaining = list(deps)
    while remaining:
        for name in remaining:
            if all(up in done or up not in deps for up in deps[name]):
                order.append(name)
                done.add(name)
                remaining.remove(name)
                break
    return order


def remaining_path(deps: Mapping[str, Sequence[str]], weight: Mapping[str, float]) -> dict[str, float]:
    """For each name, the heaviest path from its start to the end of the graph (itself included)."""
    downstream: dict[str, list[str]] = {n: [] for n in deps}
    for name, ups in deps.items():
        for up in ups:
            if up in downstream:
                downstream[up].append(name)
    result: dict[str, float] = {}
    for name in reversed(topological_order(deps)):
        result[name] = weight[name] + max((result[d] for d in downstream[name]), default=0.0)
    return result
