"""The Kubernetes phase's synchronous path (a non-deferrable operator): the lease watchdog and a
user's kill, over the pods hook.

A deferrable phase waits in its trigger (:class:`avsim.triggers.phase_pod.PhasePodTrigger`). A
synchronous one waits in the worker, in the stock ``KubernetesPodOperator``'s own wait: the operator
holds a :class:`SyncPodPath`, whose watchdog runs beside that wait and ends the pod when its Lease
goes stale or its node is lost, and whose kill path takes a user's kill, after which nothing is
recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from kubernetes.client.exceptions import ApiException

from avsim.attempt import PhaseAttempt
from avsim.hooks.kubernetes import PhasePodsHook
from avsim.kube import pods
from avsim.operators.exceptions import PhaseKilled
from avsim.phases.contract import AttemptResult, Detail

#: How long :meth:`SyncPodPath.kill` waits for its deletion of the pod and Lease.
ON_KILL_WAIT_SECONDS = 5.0


class SyncPodPath:
    """One sync-mode task's watchdog and kill path.

    :param hook: the Kubernetes API (:class:`avsim.hooks.kubernetes.PhasePodsHook`).
    :param node_class: where the attempt runs (how a vanished or lost pod is classed).
    :param check_interval: seconds between the watchdog's looks at the pod and its Lease.
    :param log: the task's logger.
    :param killed: set by :meth:`kill` (a user ended the running task; the task records nothing);
        the operator's own, when a kill may come before the attempt's launch.
    """

    def __init__(
        self,
        hook: PhasePodsHook,
        *,
        node_class: str,
        check_interval: float,
        log: Any,
        killed: threading.Event | None = None,
    ) -> None:
        self.hook = hook
        self.node_class = node_class
        self.check_interval = check_interval
        self.log = log
        self.killed = killed if killed is not None else threading.Event()
        #: How the watchdog ended the pod (lease expired, node lost), read by the operator's cleanup.
        self.ended: AttemptResult | None = None

    def delete(self, namespace: str, name: str, grace: int | None = None) -> None:
        """Delete a pod and its Lease; already gone is fine."""
        for failure in self.hook.delete_pod_and_lease(namespace, name, grace):
            self.log.warning("could not delete %s", failure)

    def kill(self, pod: Any, grace: int | None) -> None:
        """A user's kill (the operator's ``on_kill``, from the task runner's SIGTERM handler): flag it and
        delete the attempt's pod (with its grace period) and its Lease. The deletion runs in its own
        thread, waited for a few seconds: the handler interrupts the task's thread, which may hold the
        API client's connection pool; the task's thread deletes again (idempotent) before it raises."""
        self.killed.set()
        if pod is None:
            return
        deleting = threading.Thread(
            target=self.delete,
            args=(pod.metadata.namespace, pod.metadata.name, grace),
            name="avsim-on-kill",
            daemon=True,
        )
        deleting.start()
        deleting.join(timeout=ON_KILL_WAIT_SECONDS)

    def raise_killed(self, namespace: str, name: str, grace: int | None, where: str) -> NoReturn:
        """End a killed task: make sure its pod and Lease are gone, record nothing, raise."""
        self.delete(namespace, name, grace=grace)
        raise PhaseKilled(f"{where} was killed (pod {name}): nothing recorded")

    def start_watchdog(self, attempt: PhaseAttempt, pod_of: Callable[[], Any]) -> threading.Event:
        """A thread that ends the pod (``pod_of()``, once created) when its Lease goes stale or its node
        is lost; set the returned event to stop it."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.check_interval):
                pod = pod_of()
                if pod is not None and self._look(attempt, pod.metadata.namespace, pod.metadata.name):
                    return

        threading.Thread(target=watch, name="avsim-lease-watchdog", daemon=True).start()
        return stop

    def _look(self, attempt: PhaseAttempt, ns: str, name: str) -> bool:
        """One look at the pod and its Lease; True when it ended the pod."""
        try:
            remote = self.hook.read_pod(ns, name)
        except ApiException:
            return False
        if remote is None:
            return False
        lost = pods.classify_pod(remote, node_class=self.node_class, now=time.time())
        if lost is not None and lost.detail == Detail.NODE_LOST:
            self._end(ns, name, lost)
            return True
        lease_seconds = attempt.runtime.lease_seconds
        if not lease_seconds or not pods.is_running(remote) or pods.is_terminating(remote):
            return False
        try:
            lease = self.hook.read_lease(ns, name)
        except ApiException:
            return False
        if pods.pod_lease_age(remote, lease, time.time()) <= lease_seconds:
            return False
        expired = pods.classify_pod(
            remote, node_class=self.node_class, lease_expired=True, lease_seconds=lease_seconds
        )
        self._end(ns, name, expired)
        return True

    def _end(self, ns: str, name: str, result: AttemptResult | None) -> None:
        self.log.error("pod %s: %s; ending it", name, result.reason if result else "")
        self.ended = result
        self.delete(ns, name, grace=0)
