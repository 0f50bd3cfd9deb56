"""A run's artifact files, served by the avsim app: any path under ``runs/<run key>/``, nothing else.

Paths are checked segment by segment before anything touches storage (no ``..``, ``.``, empty segment,
backslash or NUL; the run key one segment as :func:`avsim.artifacts.safe_key` makes it), and a local
path must resolve under the run's folder. Every response carries a sandboxing Content-Security-Policy
and ``nosniff``: simulations write the artifacts (docs/security.md, "The Airflow API and the avsim page").
"""

from __future__ import annotations

import mimetypes
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from avsim.artifacts import RunLayout
from avsim.errors import AvsimError

#: Most entries a folder listing shows.
MAX_LISTED = 1000
CHUNK = 256 * 1024
_SEGMENT = re.compile(r"^[^/\\\x00]+$")
_RUN_KEY = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
#: Headers of every artifact response.
INERT = {
    "Content-Security-Policy": "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}
#: Types shown in the browser rather than downloaded.
_INLINE = ("text/", "image/", "application/json")


class RefusedPath(AvsimError):
    """A request for something that is not an artifact of the run (a traversal, a bad run key)."""


@dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    size: int | None


def check_segment(value: str, what: str) -> str:
    if value in ("", ".", "..") or not _SEGMENT.match(value):
        raise RefusedPath(f"{what} {value!r} is not one plain path segment")
    return value


def check_run_key(run_key: str) -> str:
    if not _RUN_KEY.match(run_key) or run_key in (".", ".."):
        raise RefusedPath(f"run key {run_key!r} is not a run key (letters, digits, '.', '_', '-')")
    return run_key


def relative_parts(relpath: str) -> list[str]:
    """The segments of a path under the run (a trailing slash is allowed, nothing else empty)."""
    trimmed = relpath[:-1] if relpath.endswith("/") else relpath
    if trimmed == "":
        return []
    if trimmed.startswith("/"):
        raise RefusedPath(f"path {relpath!r} is absolute")
    return [check_segment(p, "path segment") for p in trimmed.split("/")]


def resolve(root: str, run_key: str, relpath: str) -> Any:
    """The ObjectStoragePath of ``relpath`` under the run's prefix, after every check."""
    from avsim.storage import path

    layout = RunLayout(root, check_run_key(run_key))
    parts = relative_parts(relpath)
    base = path(layout.base)
    target = base.joinpath(*parts) if parts else base
    if str(base.protocol) in ("file", "local", ""):
        real_base = os.path.realpath(base.path)
        real = os.path.realpath(target.path)
        if real != real_base and not real.startswith(real_base + os.sep):
            raise RefusedPath(f"path {relpath!r} leaves the run's folder")
    return target


def listing(target: Any) -> list[Entry]:
    entries = []
    for child in sorted(target.iterdir(), key=lambda p: p.name)[:MAX_LISTED]:
        is_dir = bool(child.is_dir())
        size = None
        if not is_dir:
            try:
                size = int(
                    child.stat().get("size") if isinstance(child.stat(), dict) else child.stat().st_size
                )
            except (OSError, AttributeError, TypeError, ValueError):
                size = None
        entries.append(Entry(child.name, is_dir, size))
    return entries


def media_type(name: str) -> str:
    if name.endswith((".log", ".out", ".err", ".txt")):
        return "text/plain; charset=utf-8"
    guessed = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return (
        f"{guessed}; charset=utf-8"
        if guessed.startswith("text/") or guessed == "application/json"
        else guessed
    )


def disposition(name: str, kind: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    how = "inline" if kind.startswith(_INLINE) else "attachment"
    return f'{how}; filename="{safe}"'


def stream(target: Any) -> Iterator[bytes]:
    with target.open("rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk
