"""The cncf KubernetesPodOperator's private members avsim's Kubernetes operator relies on, through
avsim.airflow_internals, checked against the installed provider: a provider upgrade that renames or
changes one of them fails here, and airflow_internals.py is the one file to change."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from kubernetes.client import models as k8s

from avsim import airflow_internals


def _context(map_index: int) -> dict[str, object]:
    ti = SimpleNamespace(
        dag_id="avsim_weekly_shard", task_id="standard.simulate", map_index=map_index, try_number=3
    )
    return {"ti": ti, "run_id": "w49__shard_0001", "dag": SimpleNamespace()}


def test_the_task_instance_labels_are_the_stock_operators() -> None:
    """The labels the stock operator finds its pod by: dag, task, run, map index and try number."""
    labels = airflow_internals.kpo_ti_pod_labels(_context(7))
    assert labels["dag_id"] == "avsim_weekly_shard" and labels["task_id"] == "standard.simulate"
    assert (labels["map_index"], labels["try_number"], labels["kubernetes_pod_operator"]) == (
        "7",
        "3",
        "True",
    )
    assert labels["run_id"]  # sanitised for Kubernetes, not necessarily equal
    assert "map_index" not in airflow_internals.kpo_ti_pod_labels(_context(-1))
    assert airflow_internals.kpo_ti_pod_labels(None) == {}
    # The stock operator reads the same labels when it looks for the pod (without the try number).
    assert "include_try_number" in inspect.signature(KubernetesPodOperator._get_ti_pod_labels).parameters


def test_the_killed_flag_is_the_one_the_stock_on_kill_sets_and_its_cleanup_reads() -> None:
    op = KubernetesPodOperator(task_id="probe", name="probe", image="busybox")
    assert airflow_internals.kpo_killed(op) is False
    op.on_kill()  # no pod yet: the stock on_kill only sets its flag
    assert airflow_internals.kpo_killed(op) is True and op._killed is True  # the provider's own name
    fresh = KubernetesPodOperator(task_id="probe2", name="probe2", image="busybox")
    airflow_internals.kpo_mark_killed(fresh)
    assert airflow_internals.kpo_killed(fresh) is True
    # With the flag set the stock cleanup stands down before it touches the pod or the API client.
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p", namespace="n"))
    assert fresh.cleanup(pod, pod) is None
