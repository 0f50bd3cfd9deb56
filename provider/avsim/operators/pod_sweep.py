"""Delete the phase pods (and their heartbeat Leases) a shard run left behind, at its ``summarize``.

A Kubernetes phase's pod is deleted by whoever ends its attempt: the operator in a worker, or its
trigger (also when a user's action kills the trigger: :meth:`avsim.triggers.phase_pod.PhasePodTrigger.on_kill`).
One user action escapes both: a task marked failed or success while it was deferred and no triggerer
had picked its trigger up yet. Airflow drops the trigger row, nothing runs ``on_kill``, and the pod
holds its node (a GPU) until ``activeDeadlineSeconds``. The shard's ``summarize`` runs when every
phase task of the shard has ended, so any pod of its cases created before it began is such a leftover
(:func:`avsim.kube.pods.leftover_pods`); this module lists the run's pods by label and deletes those.
The attempt's ledger record stays ``started``: the phase's next try (a repair) records it as lost.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from avsim.kube import pods

if TYPE_CHECKING:
    from avsim.settings import KubernetesSettings

log = logging.getLogger(__name__)


def delete_pod_and_lease(
    core: Any, leases: Any, namespace: str, name: str, grace: int | None = None
) -> list[str]:
    """Delete an attempt's pod and its Lease (named after it) with the synchronous clients: gone
    already is what was wanted. Returns what could not be deleted, and why (the caller logs it)."""
    from kubernetes.client.exceptions import ApiException

    failed = []
    for kind, delete in (
        ("pod", lambda: core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace)),
        ("Lease", lambda: leases.delete_namespaced_lease(name, namespace)),
    ):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                failed.append(f"{kind} {namespace}/{name}: {exc.reason}")
    return failed


def sweep_leftover_pods(
    kube: KubernetesSettings, run_key: str, case_ids: Iterable[str], created_before: dt.datetime
) -> list[str]:
    """Delete the leftover pods of ``case_ids`` of run ``run_key`` and their Leases; return their names."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from kubernetes.client import CoordinationV1Api

    core = KubernetesHook(conn_id=kube.conn_id).core_v1_client
    listed = core.list_namespaced_pod(kube.namespace, label_selector=pods.run_selector(run_key))
    as_dicts = [core.api_client.sanitize_for_serialization(p) for p in listed.items]
    names = pods.leftover_pods(as_dicts, case_ids, created_before)
    leases = CoordinationV1Api(core.api_client)
    for name in names:
        for failure in delete_pod_and_lease(core, leases, kube.namespace, name):
            log.error("could not delete the leftover %s", failure)
        log.warning(
            "deleted pod %s/%s and its Lease: its phase task had ended (marked failed or success before a "
            "triggerer took its trigger), so nothing else would have",
            kube.namespace,
            name,
        )
    return names
