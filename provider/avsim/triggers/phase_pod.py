"""The trigger a deferred Kubernetes phase waits on: its pod's end, its preemption, its lease's expiry.

:class:`PhasePodTrigger` makes no API request of its own: it reads the triggerer's shared watch
(:class:`avsim.triggers.pod_watch.NamespaceWatch`), classifies with :func:`avsim.kube.pods.classify_pod`
and fires one :class:`avsim.contracts.pod.PodEvent` (``ended`` or ``error``); :meth:`PhasePodTrigger.on_kill`
deletes the attempt's pod and Lease when a user kills the deferred phase. Its arguments are
JSON-friendly (docs/design.md, "The Kubernetes backend's API load").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from avsim import airflow_internals
from avsim.contracts.pod import PodEvent, PodStatus
from avsim.kube.pods import classify_pod, is_running, is_terminating, parse_time, pod_lease_age
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.resume import FALLBACK_SECONDS, resume_not_before

log = logging.getLogger(__name__)

#: The trigger hands its wait to the worker (an ``error`` event) once the shared watch has failed for
#: this many check intervals in a row; the worker reads the pod itself and waits again if it runs.
WATCH_OUTAGE_CHECKS = 10
#: How long a pod may be missing from a synced watch before it counts as gone (creation races).
MISSING_GRACE_SECONDS = 30.0
#: A killed attempt's deletion is tried once more after each of these pauses (Airflow gives on_kill
#: ``[triggerer] on_kill_timeout``, 30 s by default).
KILL_RETRY_SECONDS = (1.0, 3.0, 0.0)


class PhasePodTrigger(BaseTrigger):
    """Waits for one phase pod (one attempt) through the namespace's shared watch.

    :param pod_name: the attempt's pod (and Lease) name.
    :param namespace: its namespace.
    :param attempt: the attempt number (returned in the event).
    :param node_class: ``gpu-spot``, ``gpu-on-demand`` or ``cpu`` (a vanished spot pod was preempted).
    :param lease_seconds: end the attempt when its Lease was not renewed for this long (0: no lease).
    :param startup_timeout: end it when the pod stays Pending this long (unschedulable, stuck).
    :param kubernetes_conn_id, config_dict, cluster_context, in_cluster: how to reach the cluster
        (as ``AsyncKubernetesHook`` takes them).
    :param check_interval: how often to re-check lease ages and timeouts without a watch event.
    :param started_at: ISO time the attempt began (returned in the event).
    :param deadline_seconds: end the attempt as an infrastructure failure (``timeout``) when its pod
        has not ended this long after ``started_at`` (0: no deadline): the bound on a wait whose pod
        nothing will ever update. The operator sets it to the startup timeout, the phase's timeout,
        the pod's grace period and the stuck-Terminating bound together.
    """

    def __init__(
        self,
        *,
        pod_name: str,
        namespace: str,
        attempt: int,
        node_class: str,
        lease_seconds: float = 0.0,
        startup_timeout: float = 3600.0,
        kubernetes_conn_id: str | None = None,
        config_dict: dict[str, Any] | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        check_interval: float = 5.0,
        started_at: str = "",
        min_wait_seconds: float = FALLBACK_SECONDS,
        deadline_seconds: float = 0.0,
    ) -> None:
        super().__init__()
        self.pod_name = pod_name
        self.namespace = namespace
        self.attempt = attempt
        self.node_class = node_class
        self.lease_seconds = float(lease_seconds)
        self.startup_timeout = float(startup_timeout)
        self.kubernetes_conn_id = kubernetes_conn_id
        self.config_dict = config_dict
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.check_interval = float(check_interval)
        self.started_at = started_at
        self.min_wait_seconds = float(min_wait_seconds)
        self.deadline_seconds = float(deadline_seconds)
        #: Set when the event is yielded: from then on the attempt is Airflow's (or the resumed phase's).
        self._fired = False
        #: The trigger's own end of an attempt that ended (``end_here``: a pass being committed).
        self._ending: asyncio.Future[TriggerEvent | None] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pod_name": self.pod_name,
                "namespace": self.namespace,
                "attempt": self.attempt,
                "node_class": self.node_class,
                "lease_seconds": self.lease_seconds,
                "startup_timeout": self.startup_timeout,
                "kubernetes_conn_id": self.kubernetes_conn_id,
                "config_dict": self.config_dict,
                "cluster_context": self.cluster_context,
                "in_cluster": self.in_cluster,
                "check_interval": self.check_interval,
                "started_at": self.started_at,
                "min_wait_seconds": self.min_wait_seconds,
                "deadline_seconds": self.deadline_seconds,
            },
        )

    # -- the shared watch ---------------------------------------------------------------------
    def cluster_key(self) -> str:
        """Triggers reaching the same cluster the same way share one watch per namespace."""
        doc = json.dumps(
            [self.kubernetes_conn_id, self.config_dict, self.cluster_context, self.in_cluster],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    def _client_factory(self) -> Any:
        from avsim.hooks.kubernetes import async_connection

        return async_connection(
            self.kubernetes_conn_id, self.config_dict, self.cluster_context, self.in_cluster
        )

    def watch(self) -> Any:
        from avsim.triggers.pod_watch import NamespaceWatch

        return NamespaceWatch.shared(self.cluster_key(), self.namespace, self._client_factory)

    # -- run ----------------------------------------------------------------------------------
    async def run(self) -> AsyncIterator[TriggerEvent]:
        began = time.monotonic()
        try:
            event = await self._wait()
        except Exception as exc:  # an event, never an exception: the operator decides what it means
            event = self._event(PodStatus.ERROR, message=f"{type(exc).__name__}: {exc}")
        # Never fire within min_wait_seconds of deferring: a task resumed sooner can be failed by
        # Airflow's scheduler (avsim.resume says why).
        await resume_not_before(began, self.min_wait_seconds)
        # Shielded: a kill that arrives while a passed attempt is being committed lets the commit and
        # the deletion of its pod finish (a cancelled await would leave the commit's thread running
        # and the pod behind); on_kill waits for it.
        self._ending = asyncio.ensure_future(self.end_here(event))
        ended = await asyncio.shield(self._ending)
        self._fired = True
        if ended is not None:
            yield ended
            return
        yield TriggerEvent(event.to_json())

    async def on_kill(self) -> None:
        """A user marked the deferred phase failed or success, or cleared it: delete the attempt's pod
        and its Lease, so the pod gives its node (and GPU) back now, not at the phase's timeout.

        Airflow 3.3.2's triggerer calls this when it cancels a trigger whose row left its assignment
        (the task instance left ``deferred``), never on a trigger that fired, timed out or is shut down
        with its triggerer. It also calls it when the trigger was handed to another triggerer (this one
        missed its heartbeats, ``Trigger.assign_unassigned``): the task instance is still deferred
        then, or its state cannot be read, and the other triggerer's copy watches the same pod, so the
        pod is left alone. Nothing is committed here: the attempt's record stays ``started``, and the
        phase's next try records it as lost (``infra_failed``/``abandoned``) before it starts its own.
        """
        if self._fired:
            return  # the event is Airflow's: the resumed phase (or this trigger's end) owns the pod
        if self._ending is not None:
            # The attempt had ended and the trigger was ending it itself: a pass is committed whatever
            # the kill, and end_here deleted its pod; any other end is deleted below.
            with contextlib.suppress(Exception):
                if await asyncio.shield(self._ending) is not None:
                    return
        if not await self._killed_by_a_user():
            log.warning(
                "%s: cancelled while its task instance is still deferred, or its state unknown (handed to "
                "another triggerer): the pod is left to the trigger that runs there, or to the next try",
                self.pod_name,
            )
            return
        log.warning(
            "%s: the phase was killed by a user: deleting attempt %d's pod and Lease",
            self.pod_name,
            self.attempt,
        )
        for wait in KILL_RETRY_SECONDS:
            try:
                await self.delete_attempt()
                return
            except Exception as exc:  # the API unreachable: try again within Airflow's on_kill timeout
                log.warning("%s: could not delete the pod (%s: %s)", self.pod_name, type(exc).__name__, exc)
                await asyncio.sleep(wait)

    async def _killed_by_a_user(self) -> bool:
        """Whether a user's action ended this trigger: its task instance left ``deferred``. A triggerer
        that lost its heartbeats has its triggers moved to another with the same cancel, and then often
        cannot read the state either: no task instance, or a state unread, is not a kill. A pod left
        running by a kill so missed is deleted by the phase's next try or the shard's sweep
        (:mod:`avsim.kube.pod_sweep`), never by a guess that could delete a live attempt's pod."""
        ti = getattr(self, "task_instance", None)
        if ti is None:
            return False
        try:
            state = await asyncio.to_thread(
                airflow_internals.task_instance_state,
                airflow_internals.runtime_task_instance(),  # its get_task_states asks the triggerer's supervisor
                ti.dag_id,
                ti.run_id,
                ti.task_id,
                -1 if ti.map_index is None else int(ti.map_index),
            )
        except Exception as exc:
            log.warning(
                "%s: could not read the task instance's state (%s: %s): not taken as a kill",
                self.pod_name,
                type(exc).__name__,
                exc,
            )
            return False
        return state != "deferred"

    async def end_here(self, event: PodEvent) -> TriggerEvent | None:
        """The seam where a subclass ends the task itself instead of firing ``event`` (which resumes
        the phase in a worker): :class:`avsim.triggers.pass_commit.PassCommitTrigger` commits a passed
        attempt. Here: None, always."""
        return None

    async def delete_attempt(self) -> None:
        """Delete the attempt's pod and Lease through the shared watch's client."""
        watch = self.watch()
        async with watch.subscribe(self.pod_name, self.pod_name):
            await watch.delete_attempt(self.pod_name)

    async def _wait(self) -> PodEvent:
        watch = self.watch()
        failing_since: float | None = None
        seen = False
        missing_since: float | None = None
        pending_since = time.time()
        start = parse_time(self.started_at) or pending_since
        async with watch.subscribe(self.pod_name, self.pod_name) as sub:
            while True:
                await sub.wait(self.check_interval)
                if watch.failing:
                    # An outage is timed from its start: a long wait is no reason to give up sooner.
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > WATCH_OUTAGE_CHECKS * self.check_interval:
                        return self._event(
                            PodStatus.ERROR,
                            message=f"the watch of {self.namespace} keeps failing: {watch.failing}",
                        )
                    continue
                failing_since = None
                if self.deadline_seconds and time.time() - start > self.deadline_seconds:
                    return self._event(
                        PodStatus.ENDED,
                        outcome=Outcome.INFRA_FAILED,
                        detail=Detail.TIMEOUT,
                        reason=f"the pod did not end within {self.deadline_seconds:g}s of the attempt's start "
                        "(startup timeout + phase timeout + grace + the stuck-Terminating bound): "
                        "nothing reports on it any more",
                    )
                if not watch.synced:
                    continue
                pod = watch.pods.items.get(self.pod_name)
                if pod is None:
                    gone = seen or self.pod_name in watch.pods.deleted
                    missing_since = missing_since or time.monotonic()
                    if gone or time.monotonic() - missing_since > MISSING_GRACE_SECONDS:
                        return self._ended(classify_pod(None, node_class=self.node_class))
                    continue
                seen, missing_since = True, None
                now = time.time()
                result = classify_pod(pod, node_class=self.node_class, now=now)
                if result is not None:
                    return self._ended(result)
                if is_terminating(pod):
                    continue  # being deleted: it ends, or is found stuck (node_lost) above
                if is_running(pod):
                    lease = watch.leases.items.get(self.pod_name)
                    if self.lease_seconds and pod_lease_age(pod, lease, now) > self.lease_seconds:
                        return self._ended(
                            classify_pod(
                                pod,
                                node_class=self.node_class,
                                lease_expired=True,
                                lease_seconds=self.lease_seconds,
                            )
                        )
                elif now - pending_since > self.startup_timeout:
                    return self._event(
                        PodStatus.ENDED,
                        outcome=Outcome.INFRA_FAILED,
                        detail=Detail.STARTUP_TIMEOUT,
                        reason=f"the pod stayed Pending for more than {self.startup_timeout:g}s (unschedulable or stuck)",
                    )

    def _ended(self, result: AttemptResult | None) -> PodEvent:
        if result is None:  # the classifier names an end for a pod that is gone or expired: not here
            return self._event(PodStatus.ERROR, message=f"pod {self.pod_name}: no end to report")
        return self._event(
            PodStatus.ENDED,
            outcome=result.outcome,
            exit_code=result.exit_code,
            reason=result.reason,
            detail=result.detail,
        )

    def _event(self, status: PodStatus, **fields: Any) -> PodEvent:
        return PodEvent(
            status=status,
            pod=self.pod_name,
            namespace=self.namespace,
            attempt=self.attempt,
            started_at=self.started_at or "",
            **fields,
        )
