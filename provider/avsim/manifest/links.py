"""Paths as chains of links, for walks over a whole document (issue 28).

A walk that stored each node's full path from the root would cost O(nodes x depth): a list of a
million items 200 levels down is 200 million path segments. A walk stores one :data:`Link` per node
instead, ``(parent's link, key or index)``, and builds the path with :func:`unlink` only for the
few nodes it reports.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

#: ``(parent's link, key)``; ``None`` is the root.
Link = tuple[Any, Hashable] | None


def unlink(link: Link) -> tuple[Hashable, ...]:
    """The path a :data:`Link` chain stands for."""
    segments: list[Hashable] = []
    while link is not None:
        link, seg = link
        segments.append(seg)
    return tuple(reversed(segments))
