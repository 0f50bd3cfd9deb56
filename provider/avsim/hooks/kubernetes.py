"""Every Kubernetes API call avsim makes of its own, behind one module (as the cncf provider's hooks).

A phase's pods and their heartbeat Leases: list, read, create a Lease, delete, a failed pod's log
tail, from a worker (:class:`PhasePodsHook`, over the cncf ``KubernetesHook``'s client or the stock
pod operator's own; objects come back as JSON dicts, which :mod:`avsim.kube.pods` reads); and the
triggerer's lists, watches and deletes (:class:`AsyncPhasePodsHook`, over ``kubernetes_asyncio``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook


class PhasePodsHook(BaseHook):
    """Pods and Leases of avsim's phases, over a ``CoreV1Api`` client (``core``).

    :param core: the synchronous core client (the stock operator's ``client``, or the connection's).
    """

    def __init__(self, core: Any) -> None:
        super().__init__()
        self.core = core

    @classmethod
    def for_connection(cls, conn_id: str) -> PhasePodsHook:
        """The hook over the cncf ``KubernetesHook``'s client of connection ``conn_id``."""
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return cls(KubernetesHook(conn_id=conn_id).core_v1_client)

    @cached_property
    def coordination(self) -> Any:
        """The ``coordination.k8s.io/v1`` client (Leases), on the same connection."""
        from kubernetes.client import CoordinationV1Api

        return CoordinationV1Api(self.core.api_client)

    def as_dict(self, obj: Any) -> dict[str, Any]:
        return dict(self.core.api_client.sanitize_for_serialization(obj))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of ``namespace`` that match the label ``selector``, as JSON."""
        listed = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self.as_dict(p) for p in listed.items]

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as JSON; None when it is gone (any other API error is raised)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.as_dict(self.core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None

    def read_lease(self, namespace: str, name: str) -> dict[str, Any]:
        """The Lease as JSON (an API error is raised)."""
        return self.as_dict(self.coordination.read_namespaced_lease(name, namespace))

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None:
        """Create a Lease; one already there (a retry of this very step) is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.coordination.create_namespaced_lease(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete_pod_and_lease(self, namespace: str, name: str, grace: int | None = None) -> list[str]:
        """Delete a pod and its Lease (named after it): gone already is what was wanted. Returns what
        could not be deleted, and why (the caller logs it)."""
        from kubernetes.client.exceptions import ApiException

        failed = []
        for kind, delete in (
            ("pod", lambda: self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace)),
            ("Lease", lambda: self.coordination.delete_namespaced_lease(name, namespace)),
        ):
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    failed.append(f"{kind} {namespace}/{name}: {exc.reason}")
        return failed

    def log_tail(self, namespace: str, name: str, container: str, lines: int) -> str:
        """The last ``lines`` lines of the pod's ``container`` log ("" when it cannot be read)."""
        from kubernetes.client.exceptions import ApiException

        try:
            text = self.core.read_namespaced_pod_log(name, namespace, container=container, tail_lines=lines)
        except ApiException:
            return ""
        return str(text or "").strip()


def async_connection(
    conn_id: str | None,
    config_dict: Any = None,
    cluster_context: str | None = None,
    in_cluster: bool | None = None,
) -> Any:
    """The triggerer's API client of a connection: the cncf ``AsyncKubernetesHook``'s, as an async
    context manager that yields a ``kubernetes_asyncio`` ``ApiClient``."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

    hook = AsyncKubernetesHook(
        conn_id=conn_id, config_dict=config_dict, cluster_context=cluster_context, in_cluster=in_cluster
    )
    return hook.get_conn()


class AsyncPhasePodsHook:
    """The triggerer's calls (``kubernetes_asyncio``) over an ``ApiClient`` (``api``): the shared
    watch's lists and watches of pods and Leases, and an attempt's deletion. Responses are raw
    (``_preload_content=False``); the caller reads and releases them."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def list(self, kind: str, namespace: str, **kwargs: Any) -> Any:
        """List (or with ``watch=True``, watch) the ``kind`` (``pods`` or Leases) of ``namespace``: an
        awaitable of the raw response."""
        from kubernetes_asyncio import client as k8s

        kwargs["_preload_content"] = False
        if kind == "pods":
            return k8s.CoreV1Api(self.api).list_namespaced_pod(namespace, **kwargs)
        return k8s.CoordinationV1Api(self.api).list_namespaced_lease(namespace, **kwargs)

    async def delete_pod_and_lease(self, namespace: str, name: str) -> None:
        """Delete a pod (with its own grace period) and its Lease (named after it); gone already is fine."""
        from kubernetes_asyncio import client as k8s
        from kubernetes_asyncio.client.exceptions import ApiException

        for call in (
            lambda: k8s.CoreV1Api(self.api).delete_namespaced_pod(name, namespace, _preload_content=False),
            lambda: k8s.CoordinationV1Api(self.api).delete_namespaced_lease(
                name, namespace, _preload_content=False
            ),
        ):
            try:
                resp: Any = await call()  # the raw response (_preload_content=False)
                resp.release()
            except ApiException as exc:
                if exc.status != 404:
                    raise
