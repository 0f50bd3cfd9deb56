"""The four avsim DAGs for a deployment's DAG file: the weekly pair and the ad-hoc pair.

A deployment's DAGs folder holds one file that calls :func:`avsim_dags` (docs/install.md); the
graph catalog is ``[avsim] graph_catalog``. When a worker parses the file to run one task, Airflow's
parsing context names its DAG, and only that DAG is built, so a phase task pays for its shard DAG alone.
"""

from __future__ import annotations

from typing import Any

from avsim.manifest.models import RunClass

#: dag_id -> (the pair's parent dag_id, part, run class), as the repository's four DAG files build them.
DAGS = {
    "avsim_weekly": ("avsim_weekly", "parent", RunClass.WEEKLY),
    "avsim_weekly_shard": ("avsim_weekly", "shard", RunClass.WEEKLY),
    "avsim_adhoc": ("avsim_adhoc", "parent", RunClass.ADHOC),
    "avsim_adhoc_shard": ("avsim_adhoc", "shard", RunClass.ADHOC),
}


def avsim_dags(wanted: str | None = None) -> dict[str, Any]:
    """DAGs keyed by dag_id, for the DAG file's ``globals()``: all four, or only ``wanted`` (default:
    the DAG Airflow's parsing context names, when it names one of them)."""
    from airflow.sdk import get_parsing_context

    from avsim.dagbuild.factory import load_weekly_dags

    wanted = wanted or get_parsing_context().dag_id
    chosen = [wanted] if wanted in DAGS else list(DAGS)
    dags: dict[str, Any] = {}
    for dag_id in chosen:
        parent, part, run_class = DAGS[dag_id]
        dags.update(load_weekly_dags(dag_id=parent, part=part, run_class=run_class))
    return dags
