"""The object store: one resourceVersion counter (like etcd's revision), a bounded event history
for resumable watches, and watchers fed by the committer.

Committed objects are never mutated in place: every write stores a fresh dict, so readers can
serialise what they got without holding the lock. Each watcher has its own queue; the
committer puts already-encoded event lines in it under the store lock, so no event can fall
between a watch's replay of history and its registration.
"""

from __future__ import annotations

import copy
import json
import queue
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .objects import ApiError, ResourceInfo, now_rfc3339
from .selectors import FieldPredicate, Requirement, labels_match

Obj = dict[str, Any]
_IDENTITY_FIELDS = ("uid", "creationTimestamp", "namespace", "name")
_SYSTEM_FIELDS = (*_IDENTITY_FIELDS, "deletionTimestamp", "deletionGracePeriodSeconds")
CLOSE = b""  # put in a watcher's queue when the server stops; event lines are never empty


def encode_event(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


@dataclass
class Change:
    rv: int
    resource: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None
    _lines: dict[str, bytes] = field(default_factory=dict)

    def line(self, kind: str) -> bytes:
        if kind not in self._lines:
            self._lines[kind] = encode_event(kind, self.obj)
        return self._lines[kind]


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str | None
    labels: list[Requirement]
    fields: FieldPredicate
    progress_rv: int = 0
    queue: queue.SimpleQueue[bytes] = field(default_factory=queue.SimpleQueue)

    def _selected(self, obj: Obj | None) -> bool:
        return obj is not None and labels_match(self.labels, obj) and self.fields(obj)

    def offer(self, change: Change) -> None:
        """Queue the event this watcher sees for ``change``, with the API server's selector
        transitions: an object leaving the selection is DELETED for it, one entering is ADDED."""
        self.progress_rv = change.rv
        now = self._selected(change.obj)
        before = self._selected(change.old)
        if change.type == "ADDED":
            kind = "ADDED" if now else None
        elif change.type == "DELETED":
            kind = "DELETED" if now or before else None
        elif now and before:
            kind = "MODIFIED"
        elif now:
            kind = "ADDED"
        elif before:
            kind = "DELETED"
        else:
            kind = None
        if kind is not None:
            self.queue.put(change.line(kind))


class Store:
    def __init__(self, history_size: int = 10_000):
        self.lock = threading.RLock()
        self._rv = 1  # "0" means "any version" to clients: never hand it out
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._history: deque[Change] = deque()
        self._history_size = history_size
        self._compacted_rv = 0
        self._watchers: dict[str, set[Watcher]] = {}

    # -- reads -------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def try_get(self, resource: str, namespace: str, name: str) -> Obj | None:
        return self._objects.get(resource, {}).get((namespace, name))

    def get(self, res: ResourceInfo, namespace: str, name: str) -> Obj:
        obj = self.try_get(res.name, namespace, name)
        if obj is None:
            raise ApiError.not_found(res, name)
        return obj

    def select(
        self,
        resource: str,
        namespace: str | None,
        labels: list[Requirement] | None = None,
        fields: FieldPredicate | None = None,
    ) -> tuple[list[Obj], int]:
        with self.lock:
            items = [
                obj
                for (ns, _name), obj in sorted(self._objects.get(resource, {}).items())
                if namespace is None or ns == namespace
            ]
            rv = self._rv
        selected = [
            o for o in items if (not labels or labels_match(labels, o)) and (fields is None or fields(o))
        ]
        return selected, rv

    # -- writes ------------------------------------------------------------------------------
    def _commit(self, resource: str, kind: str, namespace: str, obj: Obj, old: Obj | None) -> None:
        change = Change(self._rv, resource, namespace, kind, obj, old)
        self._history.append(change)
        while len(self._history) > self._history_size:
            self._compacted_rv = self._history.popleft().rv
        for watcher in self._watchers.get(resource, ()):
            if watcher.namespace is None or watcher.namespace == namespace:
                watcher.offer(change)

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def create(self, res: ResourceInfo, namespace: str, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError.invalid(
                    res,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if meta.get("namespace") not in (None, "", namespace):
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        for drop in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(drop, None)
        with self.lock:
            table = self._objects.setdefault(res.name, {})
            key = (namespace, meta["name"])
            if key in table:
                raise ApiError.already_exists(res, meta["name"])
            self._bump(obj)
            table[key] = obj
            self._commit(res.name, "ADDED", namespace, obj, None)
        return obj

    def replace(self, res: ResourceInfo, namespace: str, name: str, obj: Obj) -> Obj:
        """PUT: optimistic concurrency on ``metadata.resourceVersion`` when the body carries one."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") not in (None, name):
            raise ApiError.bad_request("the name of the object does not match the name on the URL")
        with self.lock:
            current = self.get(res, namespace, name)
            wanted = meta.get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise ApiError.conflict(res, name)
            return self._store_update(res, namespace, name, obj, current)

    def _store_update(
        self, res: ResourceInfo, namespace: str, name: str, obj: Obj, current: Obj, *, client: bool = True
    ) -> Obj:
        meta = obj.setdefault("metadata", {})
        cur_meta = current["metadata"]
        kept = _SYSTEM_FIELDS if client else _IDENTITY_FIELDS
        for keep in kept:
            if keep in cur_meta:
                meta[keep] = cur_meta[keep]
            else:
                meta.pop(keep, None)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        comparable = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
        before = {**current, "metadata": {k: v for k, v in cur_meta.items() if k != "resourceVersion"}}
        if comparable == before:
            return current  # a no-op write does not bump the resourceVersion
        self._bump(obj)
        self._objects[res.name][(namespace, name)] = obj
        self._commit(res.name, "MODIFIED", namespace, obj, current)
        return obj

    def mutate(
        self,
        res: ResourceInfo,
        namespace: str,
        name: str,
        change: Callable[[Obj], Obj | None],
        *,
        client: bool = False,
    ) -> Obj:
        """Apply ``change`` to a deep copy of the object and store the result (MODIFIED).

        ``client=True`` (PATCH from a client) keeps the fields a client cannot set (uid,
        creationTimestamp, deletionTimestamp); the server's own writes may set them."""
        with self.lock:
            current = self.get(res, namespace, name)
            draft = copy.deepcopy(current)
            result = change(draft)
            return self._store_update(
                res, namespace, name, draft if result is None else result, current, client=client
            )

    def remove(self, res: ResourceInfo, namespace: str, name: str) -> Obj:
        with self.lock:
            current = self.get(res, namespace, name)
            obj = copy.deepcopy(current)
            self._bump(obj)
            del self._objects[res.name][(namespace, name)]
            self._commit(res.name, "DELETED", namespace, obj, current)
            return obj

    # -- watches -----------------------------------------------------------------------------
    def watch(
        self,
        resource: str,
        namespace: str | None,
        labels: list[Requirement],
        fields: FieldPredicate,
        since: int | None,
    ) -> Watcher:
        """Register a watcher. ``since`` None or 0 starts with synthetic ADDED events for what
        exists; a resourceVersion replays the history after it (410 when compacted)."""
        watcher = Watcher(resource, namespace, labels, fields)
        with self.lock:
            watcher.progress_rv = self._rv
            if not since:
                items, _ = self.select(resource, namespace, labels, fields)
                for obj in items:
                    watcher.queue.put(encode_event("ADDED", obj))
            else:
                if since < self._compacted_rv:
                    raise ApiError.gone(since, self._compacted_rv)
                for change in self._history:
                    if (
                        change.rv > since
                        and change.resource == resource
                        and (namespace is None or change.namespace == namespace)
                    ):
                        watcher.offer(change)
                watcher.progress_rv = max(self._rv, since)
            self._watchers.setdefault(resource, set()).add(watcher)
        return watcher

    def bookmark_rv(self, watcher: Watcher) -> int | None:
        """The resourceVersion a BOOKMARK may carry now: every event up to it was delivered."""
        with self.lock:
            return watcher.progress_rv if watcher.queue.empty() else None

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.get(watcher.resource, set()).discard(watcher)

    def close_watchers(self) -> None:
        with self.lock:
            for watchers in self._watchers.values():
                for watcher in watchers:
                    watcher.queue.put(CLOSE)
            self._watchers.clear()

    @property
    def watcher_count(self) -> int:
        with self.lock:
            return sum(len(w) for w in self._watchers.values())
