"""GPU and CPU phases on their own executor queues ([avsim] gpu_queue, cpu_queue).

With the CeleryExecutor a queue is a set of machines: the workers started with ``--queues``
(docs/deployment.md, "Queues and machines"). Unset, every task keeps Airflow's default queue, so a
LocalExecutor deployment (which has no queues) builds the same DAGs it always did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avsim.dagbuild.factory import load_weekly_dags
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "dags" / "avsim_graphs.yaml"
PHASE_POOLS = {"avsim_gpu_spot": "gpu", "avsim_gpu_on_demand": "gpu", "avsim_cpu": "cpu"}


def _dags(**settings: Any) -> dict[str, Any]:
    return load_weekly_dags(catalog=CATALOG, settings=AvsimSettings(**settings))


def _default_queue() -> str:
    from airflow.configuration import conf

    return conf.get("operators", "default_queue")


def test_gpu_and_cpu_phases_go_to_their_queues_and_nothing_else_moves() -> None:
    dags = _dags(gpu_queue="avsim_gpu", cpu_queue="avsim_cpu")
    seen = {"gpu": 0, "cpu": 0}
    for dag in dags.values():
        for task in dag.tasks:
            kind = PHASE_POOLS.get(task.pool)
            if kind is None:  # prepare, shards, summarize, report...: the default queue's workers
                assert task.queue == _default_queue(), task.task_id
                continue
            assert task.queue == f"avsim_{kind}", (task.task_id, task.pool, task.queue)
            seen[kind] += 1
    # The shard DAG's GPU phases, their on-demand twins and the CPU phases; the run-level summary.
    assert seen["gpu"] >= 2 and seen["cpu"] >= 3, seen
    twins = [t for t in dags["avsim_weekly_shard"].tasks if t.task_id.endswith("_on_demand")]
    assert twins and {t.queue for t in twins} == {"avsim_gpu"}


def test_without_queues_every_task_keeps_the_default_queue() -> None:
    for dag in _dags().values():
        assert {t.queue for t in dag.tasks} == {_default_queue()}


def test_queues_survive_serialization() -> None:
    """The scheduler reads the serialized DAG: the queue must be in it."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = _dags(gpu_queue="avsim_gpu", cpu_queue="avsim_cpu")["avsim_weekly_shard"]
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    queues = {t.task_id: t.queue for t in restored.tasks}
    assert queues == {t.task_id: t.queue for t in dag.tasks}
    assert {"avsim_gpu", "avsim_cpu"} <= set(queues.values())
