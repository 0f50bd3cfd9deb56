"""What a DAG file calls: settings + graph catalog -> plan -> DAGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avsim.artifacts import shard_dag_id
from avsim.errors import ConfigError
from avsim.manifest.models import RunClass
from avsim.plan.build import build_plan
from avsim.plan.catalog import load_catalog
from avsim.plan.model import WeeklyPlan
from avsim.settings import AvsimSettings, load_settings


def max_map_length() -> int:
    from avsim.settings import airflow_config

    return int(airflow_config("core", "max_map_length", "1024"))


def load_plan(
    catalog: str | Path | None = None,
    settings: AvsimSettings | None = None,
    run_class: RunClass = RunClass.WEEKLY,
) -> WeeklyPlan:
    """The plan of the catalog ``[avsim] graph_catalog`` names, else of ``catalog`` (the one shipped
    next to the DAG file), else of ``avsim_graphs.yaml`` in the DAGs folder."""
    settings = settings or load_settings()
    path = settings.graph_catalog or catalog or settings.resolved_graph_catalog()
    plan = build_plan(load_catalog(path), settings, run_class)
    limit = max_map_length()
    if plan.shard_size > limit:
        raise ConfigError(
            f"[avsim] shard_size = {plan.shard_size} exceeds [core] max_map_length = {limit}: a family group "
            "of a full shard could not expand; lower shard_size or raise max_map_length"
        )
    return plan


def load_weekly_dags(
    catalog: str | Path | None = None,
    dag_id: str = "avsim_weekly",
    settings: AvsimSettings | None = None,
    part: str = "both",
    run_class: RunClass = RunClass.WEEKLY,
) -> dict[str, Any]:
    """DAGs keyed by dag_id, for a DAG file's globals(): the parent DAG (``part="parent"``), its
    shard DAG ``<dag_id>_shard`` (``part="shard"``), or both. The two ship as two DAG files so a
    phase task parses only the shard DAG's file.

    ``run_class=RunClass.ADHOC`` builds the same DAGs for ad-hoc simulations: triggered only, sharing
    the weekly run's pools with lower priority weights (every weekly phase outranks every ad-hoc phase).
    """
    settings = settings or load_settings()
    plan = load_plan(catalog, settings, RunClass(run_class))
    shard_dag = shard_dag_id(dag_id)
    dags: dict[str, Any] = {}
    if part in ("both", "parent"):
        from avsim.dagbuild.weekly import build_parent_dag

        dags[dag_id] = build_parent_dag(plan, settings, dag_id, shard_dag)
    if part in ("both", "shard"):
        from avsim.dagbuild.shard_dag import build_shard_dag

        dags[shard_dag] = build_shard_dag(plan, settings, shard_dag)
    if not dags:
        raise ValueError(f"part must be 'both', 'parent' or 'shard', not {part!r}")
    return dags


def shard_dags(
    catalog: str | Path, parent_dag_id: str = "avsim_weekly", run_class: RunClass = RunClass.WEEKLY
) -> dict[str, Any]:
    """The shard DAG of ``parent_dag_id`` keyed by its dag_id, for a shard DAG file's ``globals()``: it
    builds the shard DAG alone, so a phase task does not import what the parent DAG needs."""
    return load_weekly_dags(catalog=catalog, dag_id=parent_dag_id, part="shard", run_class=run_class)
