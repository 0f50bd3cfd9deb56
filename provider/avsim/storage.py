"""Reading and writing small JSON documents in the artifact store.

A ``file://`` URI (or a plain path) is read and written with the standard library: every phase task
reads the run's snapshot and the ledger, and ObjectStoragePath would import fsspec and
universal_pathlib into each task process for it (about a third of a local phase's own CPU time,
measured by ``bench/phase_overhead.py``). Any other scheme (``s3://conn@bucket/key``) goes through
ObjectStoragePath. Local writes are atomic (a temporary file renamed over the target), so a reader
never sees half a document.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any


def path(uri: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def local_path(uri: str) -> str | None:
    """The filesystem path of a ``file://`` URI or a plain path; None for any other scheme."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    return None if "://" in uri else uri


def read_local(path: str) -> Any | None:
    """The JSON document at ``path``, None when there is none."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def write_local(path: str, body: bytes) -> None:
    """Write ``body`` to ``path`` atomically (its folder must exist)."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(body)
    os.replace(tmp, path)


def _encode(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


def write_json(uri: str, data: Any) -> None:
    local = local_path(uri)
    if local is not None:
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        write_local(local, _encode(data).encode())
        return
    p = path(uri)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(_encode(data))


def read_json(uri: str) -> Any:
    local = local_path(uri)
    if local is not None:
        with open(local, "rb") as f:
            return json.loads(f.read())
    return json.loads(path(uri).read_text())


def exists(uri: str) -> bool:
    local = local_path(uri)
    if local is not None:
        return os.path.exists(local)
    return bool(path(uri).exists())
