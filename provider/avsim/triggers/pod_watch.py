"""One watch per namespace, shared by every phase trigger of a triggerer process.

:class:`NamespaceWatch` keeps one ``LIST`` + ``WATCH`` of the namespace's avsim pods and one of their
Leases in memory and fans them out to the waiting triggers: a handful of long-lived requests per
namespace, whatever the number of phases. It resumes from its last ``resourceVersion``, relists on
``410 Gone``, backs off on errors and stops when no trigger needs it; nothing in it outlives the
process (docs/design.md, "The Kubernetes backend's API load").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

log = logging.getLogger(__name__)

SELECTOR = "avsim.io/managed=true"
#: Server-side timeout of one watch request; the watch resumes from its resourceVersion after it.
WATCH_SECONDS = 240
#: Stop watching a namespace when no trigger has subscribed for this long.
IDLE_SECONDS = 60.0
MAX_BACKOFF = 30.0


@dataclass(eq=False)
class Subscription:
    """What one trigger waits on: a pod and its lease."""

    pod: str
    lease: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)
        self.changed.clear()


@dataclass
class _Stream:
    kind: str  # "pods" | "leases"
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    synced: bool = False
    resource_version: str | None = None
    failures: int = 0
    last_error: str = ""


class NamespaceWatch:
    """The avsim pods and leases of one namespace, as the API server last said, kept current by watches."""

    _shared: ClassVar[dict[tuple[int, str, str], NamespaceWatch]] = {}

    def __init__(self, key: str, namespace: str, api_client_factory: Callable[[], Any]) -> None:
        self.key = key
        self.namespace = namespace
        self._factory = api_client_factory
        self.pods = _Stream("pods")
        self.leases = _Stream("leases")
        self._subs: set[Subscription] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._idle_since = time.monotonic()
        self._client_cm: Any = None
        self._client: Any = None
        self._client_lock = asyncio.Lock()
        #: Requests this watch made (lists and watch connections), for the benchmark.
        self.requests = 0

    # -- sharing ------------------------------------------------------------------------------
    @classmethod
    def shared(cls, key: str, namespace: str, api_client_factory: Callable[[], Any]) -> NamespaceWatch:
        """The watch of ``namespace`` on the cluster ``key`` for the running event loop."""
        loop = asyncio.get_running_loop()
        k = (id(loop), key, namespace)
        watch = cls._shared.get(k)
        if watch is None or watch.closed:
            watch = cls._shared[k] = cls(key, namespace, api_client_factory)
        return watch

    @property
    def closed(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    @contextlib.asynccontextmanager
    async def subscribe(self, pod: str, lease: str) -> AsyncIterator[Subscription]:
        sub = Subscription(pod, lease)
        self._subs.add(sub)
        self._ensure_started()
        try:
            yield sub
        finally:
            self._subs.discard(sub)
            if not self._subs:
                self._idle_since = time.monotonic()

    @property
    def synced(self) -> bool:
        return self.pods.synced and self.leases.synced

    @property
    def failing(self) -> str:
        """The last error, when the watch has failed several times in a row."""
        worst = max((self.pods, self.leases), key=lambda s: s.failures)
        return worst.last_error if worst.failures >= 5 else ""

    # -- the watches ----------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._tasks and not self.closed:
            return
        self._tasks = [
            asyncio.create_task(self._run(self.pods), name=f"avsim-watch-pods-{self.namespace}"),
            asyncio.create_task(self._run(self.leases), name=f"avsim-watch-leases-{self.namespace}"),
        ]

    async def _api(self) -> Any:
        # Both streams ask at once on start: one client, created once (a second one, dropped, would
        # close the session the first is using when it is collected).
        async with self._client_lock:
            if self._client is None:
                self._client_cm = self._factory()
                self._client = await self._client_cm.__aenter__()
            return self._client

    async def _close_client(self) -> None:
        if self._client_cm is not None:
            cm, self._client_cm, self._client = self._client_cm, None, None
            with contextlib.suppress(Exception):
                await cm.__aexit__(None, None, None)

    async def _run(self, stream: _Stream) -> None:
        try:
            while self._subs or time.monotonic() - self._idle_since < IDLE_SECONDS:
                try:
                    if not stream.synced:
                        await self._list(stream)
                    await self._watch(stream)
                    stream.failures = 0
                except asyncio.CancelledError:
                    raise
                except _Gone:
                    stream.synced = False
                    stream.resource_version = None
                except Exception as exc:
                    log.debug("watch failure", exc_info=True)
                    stream.failures += 1
                    stream.last_error = f"{type(exc).__name__}: {exc}"
                    stream.synced = False
                    log.warning(
                        "avsim %s watch of %s failed (%d): %s",
                        stream.kind,
                        self.namespace,
                        stream.failures,
                        stream.last_error,
                    )
                    self._wake_all()
                    await asyncio.sleep(min(MAX_BACKOFF, 0.5 * 2**stream.failures))
        finally:
            if all(t.done() or t is asyncio.current_task() for t in self._tasks):
                await self._close_client()

    def _call(self, stream: _Stream, api: Any, **kwargs: Any) -> Any:
        from avsim.hooks.kubernetes import AsyncPhasePodsHook

        self.requests += 1
        kwargs.setdefault("label_selector", SELECTOR)
        return AsyncPhasePodsHook(api).list(stream.kind, self.namespace, **kwargs)

    async def _list(self, stream: _Stream) -> None:
        api = await self._api()
        resp = await self._call(stream, api)
        try:
            body = json.loads(await resp.read())
        finally:
            resp.release()
        stream.items = {item["metadata"]["name"]: item for item in body.get("items") or []}
        stream.resource_version = (body.get("metadata") or {}).get("resourceVersion")
        stream.synced = True
        self._wake_all()

    async def _watch(self, stream: _Stream) -> None:
        api = await self._api()
        resp = await self._call(
            stream,
            api,
            watch=True,
            resource_version=stream.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
        )
        buffer = b""
        try:
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._apply(stream, json.loads(line))
                if not self._subs and time.monotonic() - self._idle_since > IDLE_SECONDS:
                    return
        finally:
            resp.release()

    def _apply(self, stream: _Stream, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch error: {obj.get('message') or obj}")
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv:
            stream.resource_version = rv
        if kind == "BOOKMARK":
            return
        name = meta.get("name")
        if not name:
            return
        if kind == "DELETED":
            stream.items.pop(name, None)
            stream.deleted[name] = time.monotonic()
            if len(stream.deleted) > 10_000:
                for old in sorted(stream.deleted, key=stream.deleted.__getitem__)[:5_000]:
                    del stream.deleted[old]
        else:
            stream.items[name] = obj
        for sub in self._subs:
            if sub.pod == name or sub.lease == name:
                sub.changed.set()

    async def delete_attempt(self, name: str) -> None:
        """Delete an attempt's pod and its Lease (both named ``name``), with the pod's own grace
        period; already gone is fine. Call it while subscribed (the watch's client is open then)."""
        from avsim.hooks.kubernetes import AsyncPhasePodsHook

        await AsyncPhasePodsHook(await self._api()).delete_pod_and_lease(self.namespace, name)

    def _wake_all(self) -> None:
        for sub in self._subs:
            sub.changed.set()

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self._close_client()


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""
