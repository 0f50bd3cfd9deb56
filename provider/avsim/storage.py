"""Reading and writing small JSON documents in the artifact store (through ObjectStoragePath)."""

from __future__ import annotations

import json
from typing import Any


def path(uri: str) -> Any:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri)


def write_json(uri: str, data: Any) -> None:
    p = path(uri)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, sort_keys=True, default=str))


def read_json(uri: str) -> Any:
    return json.loads(path(uri).read_text())


def exists(uri: str) -> bool:
    return bool(path(uri).exists())
