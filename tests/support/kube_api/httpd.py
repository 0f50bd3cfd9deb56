"""The HTTP/1.1 side: routing, auth, Status bodies, chunked watch and log streams."""

from __future__ import annotations

import contextlib
import json
import queue
import re
import select
import socket
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .api import int_param
from .faults import parse_rules
from .objects import (
    PODS,
    RESOURCES,
    SERVER_VERSION,
    ApiError,
    ResourceInfo,
    api_group_list,
    api_versions,
    coordination_group,
    coordination_v1_resources,
    core_v1_resources,
    now_rfc3339,
    status_body,
)
from .podlog import LogQuery, render
from .selectors import parse_field_selector, parse_label_selector
from .store import CLOSE, encode_event

if TYPE_CHECKING:
    from .server import FakeKubeAPI

_RESOURCE_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>coordination\.k8s\.io)/v1)(?P<watch>/watch)?"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?/?$"
)
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/?$")
_POD_SUBRESOURCES = frozenset({"log", "status", "eviction", "exec", "attach", "portforward"})
_GROUP_OF = {"pods": None, "events": None, "leases": "coordination.k8s.io"}
_DISCOVERY = {
    "/api": None,  # filled per server (carries the address)
    "/api/v1": core_v1_resources(),
    "/apis": api_group_list(),
    "/apis/coordination.k8s.io": coordination_group(),
    "/apis/coordination.k8s.io/v1": coordination_v1_resources(),
    "/version": SERVER_VERSION,
}


def flag(query: dict[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


class ClientGone(Exception):
    """The peer closed the connection (or the server is stopping) during a stream."""


class KubeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], api: FakeKubeAPI):
        self.api = api
        super().__init__(address, KubeRequestHandler)


class KubeRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "avsim-fake-kube-apiserver"
    timeout = 120  # idle keep-alive connections are closed after this long
    server: KubeHTTPServer

    # -- connection bookkeeping ----------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        self.server.api._connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.api._connection_closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    # -- responses -------------------------------------------------------------------------------
    def _send_bytes(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)
        self._status = code

    def _send_json(self, code: int, obj: Any) -> None:
        self._send_bytes(code, json.dumps(obj, separators=(",", ":")).encode(), "application/json")

    def _start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self._status = 200

    def _chunk(self, data: bytes) -> None:
        if data:
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            except OSError as exc:
                raise ClientGone from exc

    def _end_chunked(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")

    def _peer_closed(self) -> bool:
        """True when the client hung up (or the server stops): readable with nothing to read."""
        if self.server.api.stopping:
            return True
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- dispatch --------------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        api = self.server.api
        started = time.monotonic()
        self._status = 0
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        try:
            raw = self._read_body()
            body: Any = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError as exc:
                    raise ApiError.bad_request(
                        f"couldn't get version/kind; json parse error: {exc}"
                    ) from None
            self._authorize(path)
            self._route(path, query, body)
        except ClientGone:
            self.close_connection = True
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except Exception as exc:
            api.errors.append("".join(traceback.format_exception(exc)))
            self._send_json(500, status_body(500, "InternalError", f"Internal error occurred: {exc}", {}))
        finally:
            api._log_request(self.command, self.path, self._status, time.monotonic() - started)

    def _authorize(self, path: str) -> None:
        token = self.server.api.token
        if token is None:
            return
        header = self.headers.get("Authorization")
        if header is None and path in ("/version", "/healthz", "/readyz", "/livez"):
            return  # public info, as for system:unauthenticated on a real cluster
        if header != f"Bearer {token}":
            raise ApiError.unauthorized()

    def _route(self, path: str, query: dict[str, str], body: Any) -> None:
        api = self.server.api
        method = self.command
        if path in ("/healthz", "/readyz", "/livez"):
            self._send_bytes(200, b"ok", "text/plain; charset=utf-8")
            return
        if path.startswith("/_fake/"):
            self._fake_control(method, path, body)
            return
        if path.rstrip("/") in _DISCOVERY:
            if method != "GET":
                raise ApiError.method_not_allowed()
            key = path.rstrip("/")
            api._count("get", key, "", False)
            self._send_json(200, _DISCOVERY[key] or api_versions(f"127.0.0.1:{api.port}"))
            return
        match = _NAMESPACE_PATH.match(path)
        if match and method == "GET":
            api._count("get", "namespaces", "", False)
            self._send_json(200, self._namespace(match["ns"]))
            return
        match = _RESOURCE_PATH.match(path)
        if not match or match["res"] not in RESOURCES or _GROUP_OF[match["res"]] != match["group"]:
            raise ApiError.unknown_path()
        self._resource(
            RESOURCES[match["res"]],
            match["ns"],
            match["name"],
            match["sub"],
            bool(match["watch"]),
            method,
            query,
            body,
        )

    def _namespace(self, name: str) -> dict[str, Any]:
        return {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": f"00000000-0000-0000-0000-{abs(hash(name)) % 10**12:012d}",
                "resourceVersion": "1",
                "creationTimestamp": self.server.api.started_at,
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    # -- resources -------------------------------------------------------------------------------
    def _resource(
        self,
        res: ResourceInfo,
        ns: str | None,
        name: str | None,
        sub: str | None,
        watch_path: bool,
        method: str,
        query: dict[str, str],
        body: Any,
    ) -> None:
        api = self.server.api
        if name is not None and ns is None:
            raise ApiError.unknown_path()
        if sub is not None and (res is not PODS or sub not in _POD_SUBRESOURCES):
            raise ApiError.unknown_path()
        verbs = api.verbs
        if name is None:
            if method == "GET":
                watching = watch_path or flag(query, "watch")
                api._count("watch" if watching else "list", res.name, "", watching)
                if watching:
                    self._watch(res, ns, query)
                else:
                    page = verbs.list_page(res, ns, query)
                    meta: dict[str, Any] = {"resourceVersion": str(page.resource_version)}
                    if page.continue_token:
                        meta |= {"continue": page.continue_token, "remainingItemCount": page.remaining}
                    self._send_json(
                        200,
                        {
                            "kind": f"{res.kind}List",
                            "apiVersion": res.api_version,
                            "metadata": meta,
                            "items": page.items,
                        },
                    )
                return
            if method == "POST" and ns is not None:
                api._count("create", res.name, "", False)
                self._send_json(201, verbs.create(res, ns, body))
                return
            if method == "DELETE":
                api._count("deletecollection", res.name, "", False)
                items = verbs.delete_collection(res, ns, query, body)
                self._send_json(
                    200,
                    {
                        "kind": f"{res.kind}List",
                        "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(api.store.resource_version)},
                        "items": items,
                    },
                )
                return
            raise ApiError.method_not_allowed()
        assert ns is not None
        if sub is not None:
            self._pod_subresource(ns, name, sub, method, query, body)
            return
        if method == "GET":
            api._count("get", res.name, "", False)
            self._send_json(200, api.store.get(res, ns, name))
        elif method == "PUT":
            api._count("update", res.name, "", False)
            self._send_json(200, verbs.replace(res, ns, name, body))
        elif method == "PATCH":
            api._count("patch", res.name, "", False)
            content_type = self.headers.get("Content-Type", "application/json")
            self._send_json(200, verbs.patch(res, ns, name, content_type, body))
        elif method == "DELETE":
            api._count("delete", res.name, "", False)
            self._send_json(200, verbs.delete(res, ns, name, query, body))
        else:
            raise ApiError.method_not_allowed()

    def _pod_subresource(
        self, ns: str, name: str, sub: str, method: str, query: dict[str, str], body: Any
    ) -> None:
        api = self.server.api
        if sub == "log" and method == "GET":
            api._count("get", "pods", "log", False)
            self._pod_log(ns, name, query)
        elif sub == "status" and method == "GET":
            api._count("get", "pods", "status", False)
            self._send_json(200, api.store.get(PODS, ns, name))
        elif sub == "eviction" and method == "POST":
            api._count("create", "pods", "eviction", False)
            options = (body or {}).get("deleteOptions") or {}
            api.evict_via_api(ns, name, options.get("gracePeriodSeconds"))
            self._send_json(
                201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            )
        elif sub in ("exec", "attach", "portforward"):
            api._count("get" if method == "GET" else "create", "pods", sub, False)
            raise ApiError.bad_request(
                f"pods/{sub} is not served by the avsim fake API server: pods run as local processes "
                "with no container to enter (the KubernetesPodOperator's do_xcom_push needs it)"
            )
        else:
            raise ApiError.method_not_allowed()

    # -- watch -----------------------------------------------------------------------------------
    def _watch(self, res: ResourceInfo, ns: str | None, query: dict[str, str]) -> None:
        api = self.server.api
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(res.name, query.get("fieldSelector"))
        since = int_param(query, "resourceVersion")
        timeout = int_param(query, "timeoutSeconds") or api.default_watch_timeout
        bookmarks = flag(query, "allowWatchBookmarks")
        send_initial = flag(query, "sendInitialEvents")
        try:
            watcher = api.store.watch(res.name, ns, labels, fields, None if send_initial else since)
        except ApiError as exc:
            self._start_chunked("application/json")
            self._chunk(encode_event("ERROR", exc.status()))
            self._end_chunked()
            api._count_events(1)
            return
        initial_left = watcher.queue.qsize() if send_initial else -1
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + api.bookmark_interval
        try:
            self._start_chunked("application/json")
            if initial_left == 0:
                self._bookmark(res, watcher.progress_rv, initial_end=True)
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                wait = min(deadline - now, 1.0, max(0.0, next_bookmark - now) if bookmarks else 1.0)
                try:
                    line = watcher.queue.get(timeout=wait)
                except queue.Empty:
                    if self._peer_closed():
                        raise ClientGone from None
                    if bookmarks and time.monotonic() >= next_bookmark:
                        rv = api.store.bookmark_rv(watcher)
                        if rv is not None:
                            self._bookmark(res, rv)
                        next_bookmark = time.monotonic() + api.bookmark_interval
                    continue
                if line == CLOSE:  # the server is stopping
                    raise ClientGone
                # Counted before the write: a client that has read the event must find it counted.
                api._count_events(1)
                self._chunk(line)
                if initial_left > 0:
                    initial_left -= 1
                    if initial_left == 0:
                        self._bookmark(res, watcher.progress_rv, initial_end=True)
            self._end_chunked()
        except ClientGone:
            self.close_connection = True
        finally:
            api.store.unwatch(watcher)

    def _bookmark(self, res: ResourceInfo, rv: int, *, initial_end: bool = False) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj: dict[str, Any] = {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}
        if res is PODS:
            obj |= {"spec": {"containers": None}, "status": {}}
        self.server.api._count_events(1)
        self._chunk(encode_event("BOOKMARK", obj))

    # -- logs ------------------------------------------------------------------------------------
    def _pod_log(self, ns: str, name: str, query: dict[str, str]) -> None:
        api = self.server.api
        pod = api.store.get(PODS, ns, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container")
        if not container:
            if len(names) > 1:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        elif container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        rt = api.kubelet.runtime(ns, name)
        if rt is None or rt.uid != pod["metadata"]["uid"] or rt.started_at is None:
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            waiting = (statuses[0].get("state") or {}).get("waiting") or {}
            raise ApiError.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: '
                f"{waiting.get('reason', 'ContainerCreating')}"
            )
        if flag(query, "previous"):
            raise ApiError.bad_request(
                f'previous terminated container "{container}" in pod "{name}" not found'
            )
        log_query = LogQuery(
            timestamps=flag(query, "timestamps"),
            tail_lines=int_param(query, "tailLines"),
            limit_bytes=int_param(query, "limitBytes"),
        )
        since_seconds = int_param(query, "sinceSeconds")
        if since_seconds is not None:
            log_query.since_ns = time.time_ns() - since_seconds * 1_000_000_000
        elif query.get("sinceTime"):
            log_query.since_ns = _parse_time_ns(query["sinceTime"])
        # Only the first container runs; a sidecar's log is empty.
        lines, index = rt.log.snapshot() if container == names[0] else ([], 0)
        first = b"".join(render(lines, log_query))
        if log_query.limit_bytes is not None:
            first = first[: log_query.limit_bytes]
        if not flag(query, "follow") or container != names[0]:
            self._send_bytes(200, first, "text/plain")
            return
        self._start_chunked("text/plain")
        sent = len(first)
        try:
            self._chunk(first)
            plain = LogQuery(timestamps=log_query.timestamps)
            while log_query.limit_bytes is None or sent < log_query.limit_bytes:
                if not rt.log.wait(index, timeout=1.0):
                    if self._peer_closed():
                        raise ClientGone
                    continue
                lines, index = rt.log.since(index)
                data = b"".join(render(lines, plain))
                if log_query.limit_bytes is not None:
                    data = data[: log_query.limit_bytes - sent]
                self._chunk(data)
                sent += len(data)
                if rt.log.finished and not lines:
                    break
                if api.stopping:
                    raise ClientGone
            self._end_chunked()
        except ClientGone:
            self.close_connection = True

    # -- test control ----------------------------------------------------------------------------
    def _fake_control(self, method: str, path: str, body: Any) -> None:
        api = self.server.api
        if path.rstrip("/") == "/_fake/faults":
            if method == "GET":
                self._send_json(200, {"faults": [r.to_dict() for r in api.faults()]})
            elif method == "POST":
                try:
                    rules = parse_rules(body)
                except (ValueError, TypeError) as exc:
                    raise ApiError.bad_request(f"invalid fault rules: {exc}") from None
                added = api.add_faults(rules)
                self._send_json(201, {"faults": [r.to_dict() for r in added]})
            elif method == "DELETE":
                api.clear_faults()
                self._send_json(200, {"faults": []})
            else:
                raise ApiError.method_not_allowed()
        elif path.rstrip("/") == "/_fake/calls" and method == "GET":
            calls = [c._asdict() | {"count": n} for c, n in sorted(api.calls().items())]
            self._send_json(
                200, {"calls": calls, "watch_events_sent": api.watch_events_sent, "time": now_rfc3339()}
            )
        else:
            raise ApiError.unknown_path()


def _parse_time_ns(value: str) -> int:
    import datetime as dt

    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ApiError.bad_request(f"sinceTime: invalid RFC3339 time {value!r}") from None
    return int(parsed.timestamp() * 1_000_000_000)
