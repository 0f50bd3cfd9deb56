"""The Kubernetes backend: every attempt of a phase is one pod, run by a ``KubernetesPodOperator``.

:class:`KubernetesPhaseOperator` runs the phase task's one sequence (:class:`PhaseLifecycle`) and
supplies its launch and watch: the stock ``execute``, changed only at its seams
(``build_pod_request_obj`` sends :func:`avsim.kube.pod_spec.phase_pod`; ``get_or_create_pod`` never
re-adopts a pod and creates its Lease; ``invoke_defer_method`` defers to
:class:`avsim.triggers.pass_commit.PassCommitTrigger`; ``cleanup`` classifies the pod in sync mode).
Its own API calls go through :class:`avsim.hooks.kubernetes.PhasePodsHook`.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.version import version as airflow_version
from kubernetes.client import models as k8s

from avsim.airflow_internals import (
    kpo_killed,
    kpo_mark_killed,
    kpo_ti_pod_labels,
    pod_config_dict,
    pod_mutation_hook,
)
from avsim.attempt import PhaseAttempt
from avsim.contracts.pod import PodEvent
from avsim.hooks.kubernetes import PhasePodsHook
from avsim.kube import pod_spec, pods
from avsim.links import PHASE_LINKS
from avsim.operators.kube_sync import SyncPodPath
from avsim.operators.lifecycle import HeldLifecycle, PhaseLifecycle, phase_keywords
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.phases.policy import Role
from avsim.settings import KubernetesSettings

if TYPE_CHECKING:
    from airflow.sdk import Context

#: Log lines of a failed pod kept in the attempt's reason.
LOG_TAIL_LINES = 20
#: Airflow's timeout on a deferral exceeds the trigger's own deadline by this much: the trigger ends
#: the attempt with its pod's details; Airflow's timeout is the backstop for a triggerer that cannot.
DEFERRAL_MARGIN_SECONDS = 300.0
#: Attempts whose pod is force-deleted (grace 0): a hung phase, or a pod on a node that is gone.
FORCE_DELETE_DETAILS = frozenset({Detail.LEASE_EXPIRED, Detail.NODE_LOST, Detail.TIMEOUT})


class KubernetesPhaseOperator(KubernetesPodOperator):
    """Runs one phase attempt as a pod, under the avsim phase contract.

    Takes :class:`avsim.attempt.args.PhaseArgs`'s fields as keywords, as the local operator does,
    plus the cluster settings (``kube``: :class:`avsim.settings.KubernetesSettings`); everything
    else is passed to ``KubernetesPodOperator``.
    """

    #: What a phase's pod is built from. The stock operator's other template fields (image, cmds,
    #: env_vars, volumes, ...) do not reach the pod (:func:`avsim.kube.pod_spec.phase_pod` builds it
    #: from the run's snapshot), and Airflow renders, serializes and stores every template field in
    #: each task process: the phase's start and its resume.
    template_fields: Sequence[str] = ("namespace", "kubernetes_conn_id", "case", "run", "inputs")
    ui_color = "#d8e4f3"
    #: From a phase task instance to its case page and its artifacts (avsim.links).
    operator_extra_links = PHASE_LINKS
    role: Role
    #: The try's lifecycle, built from the rendered fields when the task runs or resumes.
    lifecycle = HeldLifecycle()

    @phase_keywords
    def __init__(
        self,
        *,
        kube: KubernetesSettings | None = None,
        lease_check_interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        if kube is None:
            from avsim.settings import load_settings

            kube = load_settings().kubernetes
        kwargs.setdefault("kubernetes_conn_id", kube.conn_id)
        kwargs.setdefault("namespace", kube.namespace)
        kwargs.setdefault("deferrable", kube.deferrable)
        kwargs.setdefault("startup_timeout_seconds", kube.startup_timeout_seconds)
        kwargs.setdefault("schedule_timeout_seconds", kube.startup_timeout_seconds)
        kwargs.setdefault("service_account_name", kube.service_account)
        kwargs.setdefault("on_finish_action", "delete_pod")
        kwargs.setdefault("get_logs", True)
        kwargs.setdefault("log_events_on_startup", False)
        kwargs.setdefault("termination_grace_period", pod_spec.DEFAULT_GRACE_SECONDS)
        # Never re-adopt a pod: a new try is a new attempt with its own pod (see get_or_create_pod).
        kwargs["durable"] = False
        kwargs["random_name_suffix"] = False
        super().__init__(**kwargs)
        self.kube = kube
        self.lease_check_interval = lease_check_interval
        self._attempt: PhaseAttempt | None = None
        self._started: dt.datetime | None = None
        #: Set by :meth:`on_kill` (a user ended the running task): the task records nothing.
        self._user_kill = threading.Event()
        #: Sync mode: how the finished pod ended, as :meth:`cleanup` classified it.
        self._sync_ended: AttemptResult | None = None
        self._sync: SyncPodPath | None = None

    @cached_property
    def pods_hook(self) -> PhasePodsHook:
        """The Kubernetes API of avsim's own calls, over the stock operator's client."""
        return PhasePodsHook(self.client)

    # -- the lifecycle's sequence, and the backend's launch and watch ------------------------------
    def execute(self, context: Context) -> Any:
        self.lifecycle = PhaseLifecycle.of(self, context)
        return self._result(context, self.lifecycle.execute(context, self))

    def runs(self, attempt: PhaseAttempt) -> str:
        return "pod " + pods.pod_name(attempt.layout.run_key, attempt.case_id, attempt.phase, attempt.attempt)

    def launch(self, attempt: PhaseAttempt, started: dt.datetime, context: Context) -> AttemptResult:
        """The stock ``execute``: deferrable, it creates the pod and defers (the trigger watches it);
        sync, it waits for the pod beside the lease watchdog and ends in :meth:`cleanup`, which
        classifies it (a stock error after that is superseded by the classified end)."""
        self._attempt, self._started = attempt, started
        node_class = self.lifecycle.args.node_class
        self._sync = SyncPodPath(
            self.pods_hook,
            node_class=node_class,
            check_interval=self.lease_check_interval,
            log=self.log,
            killed=self._user_kill,
        )
        # The stock operator finds the attempt's pod (sync mode) by these and the task instance's labels.
        self.labels = pods.attempt_labels(
            attempt.layout.run_key, attempt.case_id, attempt.phase, attempt.attempt, node_class
        )
        watchdog = None if self.deferrable else self._sync.start_watchdog(attempt, lambda: self.pod)
        try:
            super().execute(context)  # deferrable: defers; sync: ends in cleanup()
        except Exception:
            if self._sync_ended is None:
                raise
        finally:
            if watchdog is not None:
                watchdog.set()
        assert self._sync_ended is not None
        return self._sync_ended

    def _result(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        """Hand the phase's result to its downstream phases.

        The stock operator's ``do_xcom_push`` means its XCom sidecar (and ``pods/exec``), so it stays
        off, and with it Airflow's push of the return value: the result is pushed here instead.
        """
        from airflow.sdk.bases.xcom import BaseXCom

        context["ti"].xcom_push(key=BaseXCom.XCOM_RETURN_KEY, value=result)
        return result

    # -- the pod ----------------------------------------------------------------------------------
    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        if self._attempt is not None:
            return self.attempt_pod(self._attempt, context, dry_run=dry_run)
        pod = super().build_pod_request_obj(context, dry_run=dry_run)  # no attempt: nothing runs it
        pod.spec.enable_service_links = False
        return pod

    def attempt_pod(
        self, attempt: PhaseAttempt, context: Context | None = None, *, dry_run: bool = False
    ) -> k8s.V1Pod:
        """The pod of ``attempt`` as sent: :func:`avsim.kube.pod_spec.phase_pod`, plus what the stock
        operator adds to every pod it builds (the task instance's identifying labels, which it finds
        the pod by, and Airflow's version) and the cluster's ``pod_mutation_hook``."""
        run_id = str((context or {}).get("run_id") or "")
        pod = pod_spec.phase_pod(
            attempt,
            namespace=str(self.namespace or self.kube.namespace),
            priority=pod_spec.priority_key(self.lifecycle.service.books.descriptor.run_class, run_id),
            kube=self.kube,
            service_account=self.service_account_name,
            grace_seconds=self.termination_grace_period,
        )
        labels = kpo_ti_pod_labels(context)
        self.log.info("Building pod %s with labels: %s", pod.metadata.name, labels)
        pod.metadata.labels.update(labels)
        pod.metadata.labels["airflow_version"] = airflow_version.replace("+", "-")
        if not dry_run:
            pod.metadata.labels["airflow_kpo_in_cluster"] = str(self.hook.is_in_cluster)
        pod_mutation_hook(pod)
        return pod

    def execute_async(self, context: Context) -> None:
        """The stock deferrable start (create the pod, defer) without its ``pod_name`` and
        ``pod_namespace`` XComs: two execution-API calls per attempt that nothing reads here (the pod's
        name is the attempt's runner in the ledger, shown on the case page). With pod callbacks set,
        the stock start runs unchanged."""
        if self.callbacks:
            super().execute_async(context)
            return
        if self.pod_request_obj is None:
            self.pod_request_obj = self.build_pod_request_obj(context)
        if self.pod is None:
            self.pod = self.get_or_create_pod(pod_request_obj=self.pod_request_obj, context=context)
        if self._user_kill.is_set():  # killed before it deferred: no trigger would end the pod
            self._raise_killed(self.pod)
        self.invoke_defer_method(context=context)

    def get_or_create_pod(self, pod_request_obj: k8s.V1Pod, context: Context) -> k8s.V1Pod:
        assert self._attempt is not None
        if self._user_kill.is_set():  # killed before its pod was created: nothing is launched
            self._raise_killed(pod_request_obj)
        self._remove_earlier_attempts(self._attempt, pod_request_obj.metadata.namespace)
        pod = super().get_or_create_pod(pod_request_obj, context)
        self._create_lease(self._attempt, pod.metadata.namespace, pod.metadata.name)
        if self._user_kill.is_set():  # killed while the pod was created: on_kill did not see it
            self._raise_killed(pod)
        return pod

    def _remove_earlier_attempts(self, a: PhaseAttempt, namespace: str) -> None:
        """Delete every pod (and Lease) of another attempt of this phase: no earlier try is re-adopted.
        A first attempt has none (the ledger numbers a phase's attempts from 1): nothing to list."""
        if a.attempt <= 1:
            return
        selector = pods.phase_selector(a.layout.run_key, a.case_id, a.phase)
        for old in self.pods_hook.list_pods(namespace, selector):
            meta = old.get("metadata") or {}
            number = (meta.get("labels") or {}).get(pods.LABEL_ATTEMPT)
            if number == str(a.attempt):
                continue
            self.log.warning(
                "deleting pod %s of an earlier attempt (%s) of %s before attempt %d starts",
                meta.get("name"),
                number,
                self.lifecycle.args.where(),
                a.attempt,
            )
            self._delete(namespace, meta["name"], grace=0)

    def lease_request_obj(self, a: PhaseAttempt, namespace: str, name: str) -> dict[str, Any]:
        """The attempt's heartbeat Lease, as sent to the API server (see :func:`avsim.kube.pods.lease_body`)."""
        labels = pods.attempt_labels(a.layout.run_key, a.case_id, a.phase, a.attempt, a.node_class)
        return pods.lease_body(name, namespace, labels, a.runtime.lease_seconds)

    def _create_lease(self, a: PhaseAttempt, namespace: str, name: str) -> None:
        if a.runtime.lease_seconds:
            self.pods_hook.create_lease(namespace, self.lease_request_obj(a, namespace, name))

    def _delete(self, namespace: str, name: str, grace: int | None = None) -> None:
        """Delete a pod and its Lease; already gone is fine."""
        for failure in self.pods_hook.delete_pod_and_lease(namespace, name, grace):
            self.log.warning("could not delete %s", failure)

    # -- the sync path's seams: cleanup, a user's kill ---------------------------------------------
    def cleanup(
        self, pod: k8s.V1Pod, remote_pod: k8s.V1Pod, xcom_result: Any = None, context: Context | None = None
    ) -> None:
        """The stock operator's last step in sync mode: classify the pod and delete it; the lifecycle
        records the attempt. After a user's kill (:meth:`on_kill`) it raises ``PhaseKilled``."""
        if self._user_kill.is_set() and pod is not None:
            self._raise_killed(pod)
        if kpo_killed(self) or self._attempt is None or context is None or pod is None:
            return
        namespace, name = pod.metadata.namespace, pod.metadata.name
        ended = self._sync.ended if self._sync is not None else None
        result = ended or self._read_result(namespace, name, self._attempt.node_class)
        if result is None:  # still running after the stock wait gave up (e.g. startup timeout)
            result = AttemptResult(
                Outcome.INFRA_FAILED,
                None,
                "the pod did not finish: startup timeout",
                Detail.STARTUP_TIMEOUT,
                name,
            )
        self._sync_ended = self._final(result, namespace, name)

    def on_kill(self) -> None:
        """Airflow's task runner calls this from its SIGTERM handler (sync mode): a user marked the
        running task failed or success, or cleared it, or the worker is shutting down. The kill path
        (:meth:`avsim.operators.kube_sync.SyncPodPath.kill`) deletes the pod and its Lease; the task's
        thread then raises ``PhaseKilled`` and records nothing. A deferred phase is killed in its
        trigger (:meth:`avsim.triggers.phase_pod.PhasePodTrigger.on_kill`), not here."""
        self._user_kill.set()
        kpo_mark_killed(self)  # the stock operator's flag: its own cleanup steps stand down
        if self._sync is not None:
            self._sync.kill(self.pod, self.termination_grace_period)

    def _raise_killed(self, pod: k8s.V1Pod) -> NoReturn:
        namespace = pod.metadata.namespace or str(self.namespace or self.kube.namespace)
        number = self._attempt.attempt if self._attempt is not None else None
        assert self._sync is not None  # the seams that call this run within launch()
        self._sync.raise_killed(
            namespace, pod.metadata.name, self.termination_grace_period, self.lifecycle.args.where(number)
        )

    # -- deferrable: the shared-watch trigger ------------------------------------------------------
    def invoke_defer_method(self, last_log_time: Any = None, context: Context | None = None) -> None:
        from avsim.triggers.phase_pod import PhasePodTrigger

        assert self._attempt is not None and self.pod is not None and self._started is not None
        self.convert_config_file_to_dict()
        wait = dict(
            pod_name=self.pod.metadata.name,
            namespace=self.pod.metadata.namespace,
            attempt=self._attempt.attempt,
            node_class=self._attempt.node_class,
            lease_seconds=self._attempt.runtime.lease_seconds,
            startup_timeout=float(self.startup_timeout_seconds),
            kubernetes_conn_id=self.kubernetes_conn_id,
            config_dict=pod_config_dict(self),
            cluster_context=self.cluster_context,
            in_cluster=self.in_cluster,
            check_interval=self.lease_check_interval,
            started_at=self._started.isoformat(),
            deadline_seconds=self.attempt_deadline_seconds(self._attempt),
        )
        commit = self._pass_commit(context)
        if commit is not None:
            from avsim.triggers.pass_commit import PassCommitTrigger

            trigger: PhasePodTrigger = PassCommitTrigger(commit=commit, **wait)
        else:
            trigger = PhasePodTrigger(**wait)
        self.defer(
            trigger=trigger,
            method_name="phase_complete",
            # The resumed task rebuilds its attempt from these instead of reading its upstream XComs again.
            kwargs={"inputs": dict(self._attempt.inputs), "cache_key": self._attempt.cache_key},
            timeout=dt.timedelta(seconds=self.deferral_timeout_seconds(self._attempt)),
        )

    def _pass_commit(self, context: Context | None) -> dict[str, Any] | None:
        """What the trigger needs to end a passed attempt without a worker (:mod:`avsim.triggers.pass_commit`);
        None with pod callbacks (they run in the worker when the pod completes)."""
        if context is None or self.callbacks:
            return None
        assert self._attempt is not None and self._started is not None
        return self.lifecycle.pass_commit(context, self._attempt, self._started).to_json()

    def attempt_deadline_seconds(self, a: PhaseAttempt) -> float:
        """The longest an attempt's pod may take, from the attempt's start to its end: pending up to
        the startup timeout, running up to the phase's timeout (its ``activeDeadlineSeconds``), the
        grace period to stop, and the bound after which a Terminating pod counts as stuck on a lost
        node. Past it nothing will report on the pod again (its node is gone): the trigger ends the
        attempt as ``infra_failed``/``timeout``, whatever the lease setting."""
        grace = float(self.termination_grace_period or 0)
        return (
            float(self.startup_timeout_seconds)
            + float(a.runtime.timeout_seconds)
            + grace
            + pods.TERMINATING_BOUND_SECONDS
        )

    def deferral_timeout_seconds(self, a: PhaseAttempt) -> float:
        """Airflow's own timeout on the deferral: the trigger's deadline plus a margin, a backstop for a
        triggerer that cannot fire (see :meth:`resume_execution`)."""
        return self.attempt_deadline_seconds(a) + DEFERRAL_MARGIN_SECONDS

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A deferral that timed out is the attempt's infrastructure failure, recorded like any other."""
        from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR, TriggerFailureReason

        # A resumed task instance is a new task process with the operator as its DAG file builds it: an
        # on-demand twin has no case and no run there until it takes its spot task's hand-over again.
        self.lifecycle = PhaseLifecycle.of(self, context)
        error = (next_kwargs or {}).get("error")
        if next_method != TRIGGER_FAIL_REPR or error != TriggerFailureReason.TRIGGER_TIMEOUT:
            return super().resume_execution(next_method, next_kwargs, context)
        return self._deferral_timed_out(context)

    def _deferral_timed_out(self, context: Context) -> Any:
        """Airflow timed the deferral out: the triggerer never reported. Look for a commit first (the
        trigger may have committed the pass and died before Airflow took its event): a committed result
        is the phase's, and no failure is recorded over it. Otherwise the claimed attempt ends
        ``infra_failed``/``timeout`` (and the fence in :meth:`end_attempt` still refuses it if its end
        was settled meanwhile)."""
        life = self.lifecycle
        life.attempt_for(context)  # its inputs are still there: a missing one fails here
        committed, number = life.service.committed_after_timeout()
        if committed is not None:
            self.log.warning(
                "the deferral of %s timed out, but attempt %d's result is committed: returned, nothing recorded",
                life.args.where(),
                committed.result.attempt,
            )
            return self._result(context, committed.xcom())
        # The attempt this try deferred on, not the phase's current one: a newer try may own that.
        ti = context["ti"]
        number = life.service.books.attempt_of_try(int(ti.try_number), str(ti.task_id)) or number
        attempt = life.attempt_for(context, number)
        started = life.service.books.started_at(number)
        name = pods.pod_name(attempt.layout.run_key, attempt.case_id, attempt.phase, number)
        namespace = str(self.namespace or self.kube.namespace)
        limit = self.deferral_timeout_seconds(attempt)
        self.log.error(
            "the deferral of %s timed out after %gs: ending pod %s", life.args.where(number), limit, name
        )
        result = AttemptResult(
            Outcome.INFRA_FAILED,
            None,
            f"the wait for pod {name} timed out after {limit:g}s (Airflow's deferral timeout): "
            "the triggerer never reported its end",
            Detail.TIMEOUT,
            name,
        )
        # The fence first: the pod is deleted only once this try has ended the attempt it owns (a
        # newer try's ownership raises AttemptSuperseded here, and its pod is left to it).
        ended = life.record_end(context, attempt, result, started)
        self._delete(namespace, name)
        return self._result(context, life.finish(context, ended))

    def phase_complete(
        self,
        context: Context,
        event: dict[str, Any],
        inputs: dict[str, str] | None = None,
        cache_key: str | None = None,
    ) -> Any:
        """Where a deferred phase resumes: the attempt ended (or the trigger could not tell). ``inputs``
        and ``cache_key`` are the attempt's, as it deferred (absent from a deferral before they were)."""
        resolved = (inputs, cache_key or "") if inputs is not None else None
        ended = PodEvent.model_validate(event)
        attempt = self.lifecycle.attempt_for(context, ended.attempt, resolved)
        started = dt.datetime.fromisoformat(ended.started_at) if ended.started_at else dt.datetime.now(dt.UTC)
        name, namespace = ended.pod, ended.namespace
        result = ended.result()
        if result is None:
            self.log.warning(
                "the trigger could not watch pod %s: %s; reading it directly", name, ended.message
            )
            result = self._read_or_wait_again(context, attempt, started, ended)
        final = self._final(result, namespace, name)
        return self._result(context, self.lifecycle.end_attempt(context, attempt, final, started))

    def _read_or_wait_again(
        self, context: Context, attempt: PhaseAttempt, started: dt.datetime, lost: PodEvent
    ) -> AttemptResult:
        """How the pod's attempt ended, read here after its trigger lost the watch. A pod that still
        runs, or cannot be read, is waited for again (deferred) until the attempt's deadline: an API
        outage costs its length, never a live attempt. Past the deadline, the attempt ends watch_error."""
        name, namespace = lost.pod, lost.namespace
        try:
            result = self._read_result(namespace, name, attempt.node_class)
            why = "still runs"
        except Exception as exc:
            result, why = None, f"could not be read ({type(exc).__name__}: {exc})"
        if result is not None:
            return result
        age = (dt.datetime.now(dt.UTC) - started).total_seconds()
        if age < self.attempt_deadline_seconds(attempt):
            self.log.warning("pod %s %s: watching it again", name, why)
            self._attempt, self._started = attempt, started
            self.pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace))
            self.invoke_defer_method(context=context)
        return AttemptResult(
            Outcome.INFRA_FAILED, None, f"lost track of pod {name}: {lost.message}", Detail.WATCH_ERROR, name
        )

    def _read_result(self, namespace: str, name: str, node_class: str) -> AttemptResult | None:
        remote = self.pods_hook.read_pod(namespace, name)
        return pods.classify_pod(
            remote, node_class=node_class, now=time.time() if remote is not None else None
        )

    def _final(self, result: AttemptResult, namespace: str, name: str) -> AttemptResult:
        """How the pod's attempt ended, as recorded: a failure's log tail in its reason, the pod as its
        runner; the pod and its Lease deleted."""
        if result.detail != Detail.VANISHED and not result.outcome.produced_output:
            tail = self.pods_hook.log_tail(namespace, name, self.base_container_name, LOG_TAIL_LINES)
            if tail:
                self.log.info("last lines of pod %s:\n%s", name, tail)
                result = AttemptResult(
                    result.outcome,
                    result.exit_code,
                    f"{result.reason} | {tail[-400:]}".strip(" |"),
                    result.detail,
                    name,
                )
        # A pod on a lost node is never removed by a graceful delete: its kubelet is gone.
        self._delete(namespace, name, grace=0 if result.detail in FORCE_DELETE_DETAILS else None)
        return AttemptResult(result.outcome, result.exit_code, result.reason, result.detail, name)
