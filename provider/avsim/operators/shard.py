"""Starting a shard DAG run from the parent weekly run."""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator


class ShardRunOperator(TriggerDagRunOperator):
    """Creates one shard DAG run with a deterministic run id and never waits for it.

    Waiting is the job of :class:`avsim.sensors.shards.ShardRunSensor`. A retry (or a
    cleared parent task) finds the run already there and leaves it alone: shard runs are
    never reset, so nothing a shard already did is lost.
    """

    ui_color = "#f3e4d8"

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("skip_when_already_exists", True)
        kwargs.setdefault("wait_for_completion", False)
        kwargs.setdefault("reset_dag_run", False)
        kwargs.setdefault("logical_date", None)
        kwargs.setdefault("openlineage_inject_parent_info", False)
        super().__init__(**kwargs)
