"""The Kubernetes phase's synchronous path (a non-deferrable operator): the lease watchdog, the
stock operator's last step, and a user's kill.

A deferrable phase waits in its trigger (:class:`avsim.triggers.phase_pod.PhasePodTrigger`), which
watches the pod's Lease and node and ends the attempt. A synchronous one waits in the worker, in the
stock ``KubernetesPodOperator``'s own wait: :meth:`SyncPodPath._start_watchdog` runs beside it and ends
the pod when its Lease goes stale or its node is lost; :meth:`SyncPodPath.cleanup` (the stock
operator's last step) classifies the pod and ends the attempt; :meth:`SyncPodPath.on_kill` takes a
user's kill, after which nothing is recorded. :class:`avsim.operators.kubernetes.KubernetesPhaseOperator`
mixes it in before the stock operator.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Any

from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from avsim.airflow_internals import kpo_killed, kpo_mark_killed
from avsim.attempt import PhaseAttempt
from avsim.kube import pods
from avsim.phases.contract import AttemptResult, Detail, Outcome

if TYPE_CHECKING:
    from airflow.sdk import Context

#: How long :meth:`SyncPodPath.on_kill` waits for its deletion of the pod and Lease.
ON_KILL_WAIT_SECONDS = 5.0


class SyncPodPath:
    """Mixin of :class:`avsim.operators.kubernetes.KubernetesPhaseOperator`: its synchronous path.
    Everything it reads is the operator's (declared here for the type checker)."""

    _attempt: PhaseAttempt | None
    _started: dt.datetime | None
    _sync_result: dict[str, Any] | None
    _lease_expired: threading.Event
    _user_kill: threading.Event
    _watchdog_result: AttemptResult | None
    lease_check_interval: float
    termination_grace_period: Any
    namespace: Any
    kube: Any
    pod: Any
    client: Any
    coordination: Any
    node_class: str
    log: Any

    if TYPE_CHECKING:  # the operator's own (not defined here: the mixin comes first in its MRO)

        def _delete(self, namespace: str, name: str, grace: int | None = None) -> None: ...

        def _read_result(self, namespace: str, name: str) -> AttemptResult | None: ...

        def _conclude(
            self,
            context: Context,
            attempt: PhaseAttempt,
            result: AttemptResult,
            namespace: str,
            name: str,
            started: dt.datetime,
        ) -> dict[str, Any]: ...

        def _where(self, attempt: int | None = None) -> str: ...

    def cleanup(
        self, pod: k8s.V1Pod, remote_pod: k8s.V1Pod, xcom_result: Any = None, context: Context | None = None
    ) -> None:
        """The stock operator's last step in sync mode: classify the pod, record the attempt, delete the pod.
        After a user's kill (:meth:`on_kill`) nothing is recorded: it raises :class:`PhaseKilled`."""
        if self._user_kill.is_set() and pod is not None:
            self._raise_killed(pod)
        if kpo_killed(self) or self._attempt is None or context is None or pod is None:
            return
        namespace, name = pod.metadata.namespace, pod.metadata.name
        if self._lease_expired.is_set() and self._watchdog_result is not None:
            result: AttemptResult | None = self._watchdog_result
        else:
            result = self._read_result(namespace, name)
        if result is None:  # still running after the stock wait gave up (e.g. startup timeout)
            result = AttemptResult(
                Outcome.INFRA_FAILED,
                None,
                "the pod did not finish: startup timeout",
                Detail.STARTUP_TIMEOUT,
                name,
            )
        assert self._started is not None
        self._sync_result = self._conclude(context, self._attempt, result, namespace, name, self._started)

    def on_kill(self) -> None:
        """Airflow's task runner calls this from its SIGTERM handler (sync mode): a user marked the
        running task failed or success, or cleared it, or the worker is shutting down. Flag the kill and
        delete the attempt's pod (with its grace period) and its Lease; the task's thread then raises
        :class:`~avsim.operators.phase.PhaseKilled` and records nothing (the stock ``on_kill`` deleted
        the pod only, and the task went on to fail on the vanished pod with the Lease left behind).

        The deletion runs in its own thread, waited for a few seconds: the handler interrupts the
        task's thread, which may hold the API client's connection pool; the task's thread deletes
        again (idempotent) before it raises. A deferred phase is killed in its trigger
        (:meth:`avsim.triggers.phase_pod.PhasePodTrigger.on_kill`), not here."""
        self._user_kill.set()
        kpo_mark_killed(self)  # the stock operator's flag: its own cleanup steps stand down
        pod = self.pod
        if pod is None:
            return
        deleting = threading.Thread(
            target=self._delete,
            args=(pod.metadata.namespace, pod.metadata.name, self.termination_grace_period),
            name="avsim-on-kill",
            daemon=True,
        )
        deleting.start()
        deleting.join(timeout=ON_KILL_WAIT_SECONDS)

    def _raise_killed(self, pod: k8s.V1Pod) -> None:
        """End a killed task: make sure its pod and Lease are gone, record nothing, raise."""
        from avsim.operators.phase import PhaseKilled

        namespace = pod.metadata.namespace or str(self.namespace or self.kube.namespace)
        self._delete(namespace, pod.metadata.name, grace=self.termination_grace_period)
        number = self._attempt.attempt if self._attempt is not None else None
        raise PhaseKilled(f"{self._where(number)} was killed (pod {pod.metadata.name}): nothing recorded")

    def _start_watchdog(self) -> threading.Event:
        """Sync mode: a thread that ends the pod when its Lease goes stale or its node is lost
        (deferrable mode: the trigger)."""
        stop = threading.Event()
        attempt = self._attempt
        if attempt is None:
            return stop

        def end(ns: str, name: str, result: AttemptResult | None) -> None:
            self.log.error("pod %s: %s; ending it", name, result.reason if result else "")
            self._watchdog_result = result
            self._lease_expired.set()
            self._delete(ns, name, grace=0)

        def watch() -> None:
            while not stop.wait(self.lease_check_interval):
                if self.pod is None:
                    continue
                ns, name = self.pod.metadata.namespace, self.pod.metadata.name
                try:
                    remote = self.client.api_client.sanitize_for_serialization(
                        self.client.read_namespaced_pod(name, ns)
                    )
                except ApiException:
                    continue
                lost = pods.classify_pod(remote, node_class=self.node_class, now=time.time())
                if lost is not None and lost.detail == Detail.NODE_LOST:
                    end(ns, name, lost)
                    return
                if not attempt.runtime.lease_seconds or not pods.is_running(remote):
                    continue
                if pods.is_terminating(remote):
                    continue
                try:
                    lease = self.coordination.read_namespaced_lease(name, ns)
                except ApiException:
                    continue
                lease_doc = self.client.api_client.sanitize_for_serialization(lease)
                if pods.pod_lease_age(remote, lease_doc, time.time()) > attempt.runtime.lease_seconds:
                    end(
                        ns,
                        name,
                        pods.classify_pod(
                            remote,
                            node_class=self.node_class,
                            lease_expired=True,
                            lease_seconds=attempt.runtime.lease_seconds,
                        ),
                    )
                    return

        threading.Thread(target=watch, name="avsim-lease-watchdog", daemon=True).start()
        return stop
