"""``FakeKubeAPI``: the fake API server's public face for tests, benches and manual runs."""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .api import ResourceAPI
from .faults import FaultBook, FaultRule, load_rules, parse_rules
from .httpd import KubeHTTPServer
from .kubelet import Kubelet
from .objects import PODS, ApiError, now_rfc3339
from .podstatus import EVICTION_API_MESSAGE, set_condition
from .store import Obj, Store


class Call(NamedTuple):
    """One counted API request, keyed like the API server's audit log."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    resource: str  # pods, leases, events, or a discovery path such as /api/v1
    subresource: str  # log, status, eviction, exec, or ""
    watch: bool


class FakeKubeAPI:
    """A Kubernetes API server on loopback whose pods run as local processes.

    Use as a context manager (or ``start()``/``stop()``)::

        with FakeKubeAPI() as kube:
            kube.write_kubeconfig(tmp_path / "kubeconfig")
            kube.add_fault("evict", match={"env": {"CASE_ID": "c7"}}, after_seconds=1)

    :param port: 0 picks a free port.
    :param token: the bearer token clients must send (None disables auth).
    :param env: base environment of pod processes (default: this process's ``os.environ``).
    :param workdir: where pod working directories go (default: a temporary directory).
    :param start_delay: seconds a pod stays ContainerCreating before its process starts.
    :param history_size: watch events kept for resuming; older resourceVersions get 410 Gone.
    :param bookmark_interval: seconds between BOOKMARK events on watches that allow them.
    :param default_watch_timeout: server-side watch timeout when the client sends none.
    :param record_events: write core/v1 Events (Scheduled, Started, Killing, Evicted, ...).
    :param request_log: keep a bounded log of requests (``request_log()``).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
        workdir: str | Path | None = None,
        start_delay: float = 0.05,
        history_size: int = 10_000,
        bookmark_interval: float = 5.0,
        default_watch_timeout: int = 1800,
        record_events: bool = True,
        request_log: bool = False,
        node_name: str = "avsim-fake-node",
    ):
        self._requested_port = port
        self.token = token if token is not None else secrets.token_urlsafe(24)
        self._env = env
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self.start_delay = start_delay
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.record_events = record_events
        self.node_name = node_name
        self.store = Store(history_size)
        self._faults = FaultBook()
        self.errors: list[str] = []
        self.started_at = now_rfc3339()
        self.stopping = False
        self._calls: collections.Counter[Call] = collections.Counter()
        self._stats_lock = threading.Lock()
        self._events_sent = 0
        self._request_log: collections.deque[dict[str, Any]] | None = (
            collections.deque(maxlen=100_000) if request_log else None
        )
        self._connections: set[socket.socket] = set()
        self._connections_accepted = 0
        self._handler_threads: set[threading.Thread] = set()
        self._server: KubeHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._tmpdir: Path | None = None
        self.kubelet: Kubelet
        self.verbs: ResourceAPI
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeKubeAPI:
        if self._server is not None:
            raise RuntimeError("FakeKubeAPI already started")
        self._server = KubeHTTPServer(("127.0.0.1", self._requested_port), self)
        self.port = self._server.server_address[1]
        if self._workdir_arg is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="avsim-fake-kube-"))
        workdir = self._workdir_arg or self._tmpdir
        assert workdir is not None
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.kubelet = Kubelet(
            self.store,
            self._faults,
            base_env=dict(os.environ if self._env is None else self._env),
            injected_env={"AVSIM_KUBE_API_URL": self.url, "AVSIM_KUBE_TOKEN": self.token or ""},
            workdir=workdir,
            node_name=self.node_name,
            start_delay=self.start_delay,
            record_events=self.record_events,
        )
        self.verbs = ResourceAPI(self.store, self.kubelet)
        self.kubelet.start()
        self._serve_thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="fake-kube-api",
            daemon=True,
        )
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        """Close every watch and connection, kill every process started, join every thread."""
        if self._server is None or self.stopping:
            return
        self.stopping = True
        self._server.shutdown()
        self.store.close_watchers()
        with self._stats_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        self.kubelet.stop()
        with self._stats_lock:
            threads = list(self._handler_threads)
        for thread in threads:
            thread.join(timeout=5)
        if self._serve_thread is not None:
            self._serve_thread.join(timeout=5)
        self.errors.extend(self.kubelet.errors)
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- client configuration ---------------------------------------------------------------------
    def kubeconfig_dict(self, *, namespace: str = "default", context: str = "avsim-fake") -> dict[str, Any]:
        """A kubeconfig (plain http, static bearer token) for ``load_kube_config_from_dict``."""
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": user}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}
            ],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: str | Path, *, namespace: str = "default", context: str = "avsim-fake"
    ) -> Path:
        """Write a kubeconfig for the ``kubernetes`` clients and ``KubernetesHook``; returns the path."""
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            yaml.safe_dump(self.kubeconfig_dict(namespace=namespace, context=context), sort_keys=False)
        )
        return path

    @staticmethod
    def airflow_conn_env(
        conn_id: str, kubeconfig: str | Path, *, namespace: str = "default"
    ) -> dict[str, str]:
        """``{"AIRFLOW_CONN_<ID>": json}`` defining a Kubernetes connection to this server."""
        value = json.dumps(
            {
                "conn_type": "kubernetes",
                "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace},
            }
        )
        return {f"AIRFLOW_CONN_{conn_id.upper()}": value}

    # -- faults -----------------------------------------------------------------------------------
    def add_fault(
        self,
        kind: str,
        match: Mapping[str, Any] | None = None,
        *,
        after_seconds: float = 0.0,
        times: int | None = 1,
        anchor: str = "start",
        **params: Any,
    ) -> FaultRule:
        """Script a fault for pods created from now on; see ``faults.py`` for kinds and params."""
        rule = FaultRule(kind, dict(match or {}), after_seconds, times, anchor, dict(params))
        return self._faults.add(rule)

    def add_faults(self, rules: Iterable[FaultRule]) -> list[FaultRule]:
        return self._faults.extend(rules)

    def load_faults(self, source: str | Path | list[Any] | dict[str, Any]) -> list[FaultRule]:
        """Load rules from a JSON file path or an already parsed JSON value."""
        rules = parse_rules(source) if isinstance(source, list | dict) else load_rules(source)
        return self._faults.extend(rules)

    def clear_faults(self) -> None:
        self._faults.clear()

    def faults(self) -> list[FaultRule]:
        return self._faults.rules()

    def evict_via_api(self, namespace: str, name: str, grace: int | None) -> None:
        """What ``pods/{name}/eviction`` does: DisruptionTarget (EvictionByEvictionAPI), then delete."""
        self.store.mutate(
            PODS,
            namespace,
            name,
            lambda pod: set_condition(
                pod.setdefault("status", {}),
                "DisruptionTarget",
                True,
                "EvictionByEvictionAPI",
                EVICTION_API_MESSAGE,
            ),
        )
        query = {} if grace is None else {"gracePeriodSeconds": str(grace)}
        self.verbs.delete(PODS, namespace, name, query, None)

    # -- instrumentation --------------------------------------------------------------------------
    def _count(self, verb: str, resource: str, subresource: str, watch: bool) -> None:
        with self._stats_lock:
            self._calls[Call(verb, resource, subresource, watch)] += 1

    def _count_events(self, n: int) -> None:
        with self._stats_lock:
            self._events_sent += n

    def _log_request(self, method: str, path: str, status: int, seconds: float) -> None:
        if self._request_log is not None:
            self._request_log.append(
                {"time": time.time(), "method": method, "path": path, "status": status, "seconds": seconds}
            )

    def _connection_opened(self, conn: socket.socket) -> None:
        with self._stats_lock:
            self._connections.add(conn)
            self._connections_accepted += 1
            self._handler_threads.add(threading.current_thread())

    def _connection_closed(self, conn: socket.socket) -> None:
        with self._stats_lock:
            self._connections.discard(conn)
            self._handler_threads.discard(threading.current_thread())

    def calls(self) -> collections.Counter[Call]:
        with self._stats_lock:
            return collections.Counter(self._calls)

    def call_count(
        self,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        watch: bool | None = None,
    ) -> int:
        """Sum of counted calls matching every given field."""
        return sum(
            n
            for call, n in self.calls().items()
            if (verb is None or call.verb == verb)
            and (resource is None or call.resource == resource)
            and (subresource is None or call.subresource == subresource)
            and (watch is None or call.watch == watch)
        )

    def reset_calls(self) -> None:
        with self._stats_lock:
            self._calls.clear()
            self._events_sent = 0

    @property
    def watch_events_sent(self) -> int:
        with self._stats_lock:
            return self._events_sent

    @property
    def open_connections(self) -> int:
        with self._stats_lock:
            return len(self._connections)

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted since start (a client that reconnects per call shows here)."""
        with self._stats_lock:
            return self._connections_accepted

    @property
    def active_watches(self) -> int:
        return self.store.watcher_count

    def request_log(self) -> list[dict[str, Any]]:
        if self._request_log is None:
            raise RuntimeError("start FakeKubeAPI(request_log=True) to keep a request log")
        return list(self._request_log)

    # -- assertions helpers -----------------------------------------------------------------------
    def pods(self, namespace: str | None = None) -> list[Obj]:
        """A deep-copied snapshot of the pods (all namespaces by default)."""
        items, _ = self.store.select("pods", namespace)
        return copy.deepcopy(items)

    def pod(self, name: str, namespace: str = "default") -> Obj | None:
        obj = self.store.try_get("pods", namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def leases(self, namespace: str | None = None) -> list[Obj]:
        items, _ = self.store.select("leases", namespace)
        return copy.deepcopy(items)

    def events_for(self, name: str, namespace: str = "default") -> list[Obj]:
        items, _ = self.store.select("events", namespace)
        return [copy.deepcopy(e) for e in items if e["involvedObject"]["name"] == name]

    def process_of(self, name: str, namespace: str = "default") -> int | None:
        """The pid of the pod's running process (its process group id too), or None."""
        rt = self.kubelet.runtime(namespace, name)
        if rt is None or rt.proc is None or rt.state != "running":
            return None
        return rt.proc.pid

    def started_pids(self) -> list[int]:
        """Pids of every process still tracked (for orphan checks after ``stop()``)."""
        return [rt.proc.pid for rt in self.kubelet.runtimes() if rt.proc is not None]

    def logs(self, name: str, namespace: str = "default") -> str:
        rt = self.kubelet.runtime(namespace, name)
        return rt.log.text() if rt is not None else ""

    def wait_for_pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        phase: str | tuple[str, ...] | None = None,
        predicate: Callable[[Obj], bool] | None = None,
        gone: bool = False,
        timeout: float = 30.0,
    ) -> Obj | None:
        """Poll until the pod is in ``phase`` / satisfies ``predicate`` / is ``gone``; TimeoutError names the last status."""
        phases = (phase,) if isinstance(phase, str) else phase
        end = time.monotonic() + timeout
        last: Obj | None = None
        while time.monotonic() < end:
            last = self.pod(name, namespace)
            if gone and last is None:
                return None
            if last is not None and not gone:
                current = (last.get("status") or {}).get("phase")
                if (phases is None or current in phases) and (predicate is None or predicate(last)):
                    return last
            time.sleep(0.02)
        status = (last or {}).get("status")
        raise TimeoutError(f"pod {namespace}/{name} not as expected after {timeout}s; last status: {status}")


__all__ = ["ApiError", "Call", "FakeKubeAPI"]
