"""PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (as merge patch), JSON patch (RFC 6902).

Strategic merge patch is applied with merge-patch semantics: maps merge key by key, ``null``
deletes, lists are replaced whole. That is exact for what the provider and lease holders
patch (labels, annotations, lease spec scalars); list merge keys (``containers`` by name)
and ``$patch`` directives are not implemented.
"""

from __future__ import annotations

import copy
from typing import Any

from .objects import ApiError

MERGE_TYPES = {"application/merge-patch+json", "application/strategic-merge-patch+json"}
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError.bad_request(
            f"the server rejected our request due to an error in our request: bad path {path!r}"
        )
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError.bad_request("json patch body must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        try:
            doc = _apply_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(
                422,
                "Invalid",
                f"the server rejected our request due to an error in our request: {op!r}: {exc}",
            ) from exc
    return doc


def _get(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _remove(doc: Any, parts: list[str]) -> Any:
    parent, last = _parent(doc, parts)
    if isinstance(parent, list):
        return parent.pop(int(last))
    return parent.pop(last)


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts)
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "add":
        return _add(doc, parts, copy.deepcopy(op["value"]))
    if kind == "remove":
        _remove(doc, parts)
        return doc
    if kind == "replace":
        _get(doc, parts)  # must exist
        if not parts:
            return copy.deepcopy(op["value"])
        parent, last = _parent(doc, parts)
        parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        return doc
    if kind == "test":
        if _get(doc, parts) != op["value"]:
            raise ValueError("test operation failed")
        return doc
    if kind in ("move", "copy"):
        source = _pointer(op["from"])
        value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
        return _add(doc, parts, value)
    raise ValueError(f"unknown op {kind!r}")


def apply_patch(content_type: str, current: dict[str, Any], body: Any) -> dict[str, Any]:
    media = content_type.split(";")[0].strip().lower()
    if media in MERGE_TYPES:
        if not isinstance(body, dict):
            raise ApiError.bad_request("merge patch body must be a JSON object")
        return merge_patch(current, body)
    if media == JSON_PATCH:
        result = json_patch(current, body)
        if not isinstance(result, dict):
            raise ApiError.bad_request("json patch must leave an object")
        return result
    raise ApiError.unsupported_media(media)
