"""What a DAG file calls: settings + graph catalog -> plan -> DAGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avsim.errors import ConfigError
from avsim.manifest.models import RunClass
from avsim.plan.build import build_plan
from avsim.plan.catalog import load_catalog
from avsim.plan.model import WeeklyPlan
from avsim.settings import AvsimSettings, load_settings


def max_map_length() -> int:
    from airflow.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)


def load_plan(catalog: str | Path | None = None, settings: AvsimSettings | None = None) -> WeeklyPlan:
    settings = settings or load_settings()
    path = catalog or settings.resolved_graph_catalog()
    plan = build_plan(load_catalog(path), settings, RunClass.WEEKLY)
    limit = max_map_length()
    if plan.shard_size > limit:
        raise ConfigError(
            f"[avsim] shard_size = {plan.shard_size} exceeds [core] max_map_length = {limit}: a family group "
            "of a full shard could not expand; lower shard_size or raise max_map_length"
        )
    return plan


def load_weekly_dags(
    catalog: str | Path | None = None, dag_id: str = "avsim_weekly", settings: AvsimSettings | None = None
) -> dict[str, Any]:
    """The parent weekly DAG and its shard DAG, keyed by dag_id, for a DAG file's globals()."""
    from avsim.dagbuild.weekly import build_weekly_dags

    settings = settings or load_settings()
    return build_weekly_dags(load_plan(catalog, settings), settings, dag_id)
