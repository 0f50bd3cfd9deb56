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
from typing import TYPE_CHECKING

from avsim.kube import pods

if TYPE_CHECKING:
    from avsim.settings import KubernetesSettings

log = logging.getLogger(__name__)


def sweep_leftover_pods(
    kube: KubernetesSettings, run_key: str, case_ids: Iterable[str], created_before: dt.datetime
) -> list[str]:
    """Delete the leftover pods of ``case_ids`` of run ``run_key`` and their Leases; return their names."""
    from avsim.hooks.kubernetes import PhasePodsHook

    hook = PhasePodsHook.for_connection(kube.conn_id)
    listed = hook.list_pods(kube.namespace, pods.run_selector(run_key))
    names = pods.leftover_pods(listed, case_ids, created_before)
    for name in names:
        for failure in hook.delete_pod_and_lease(kube.namespace, name):
            log.error("could not delete the leftover %s", failure)
        log.warning(
            "deleted pod %s/%s and its Lease: its phase task had ended (marked failed or success before a "
            "triggerer took its trigger), so nothing else would have",
            kube.namespace,
            name,
        )
    return names
