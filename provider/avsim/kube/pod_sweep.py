"""Delete the phase pods (and their Leases) a shard run left behind, at its ``summarize``.

A deferred phase marked failed or success before any triggerer took its trigger leaves its pod
running (nothing runs ``on_kill``). ``summarize`` runs once every phase task of the shard ended, so
any pod of its cases created before it began is such a leftover (:func:`avsim.kube.pods.leftover_pods`):
it is deleted with its Lease; its attempt stays ``started`` for the next try to record as lost.
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
