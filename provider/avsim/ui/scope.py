"""Which DAGs are avsim's: the ones the metadata database lists with the tag :data:`AVSIM_TAG`.

The DAG builder tags every DAG it makes with it (the weekly and ad-hoc DAGs and their shard DAGs).
Airflow shows the plugin's run and task-instance tabs on every DAG; the pages answer only for these.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from avsim import airflow_internals

#: The tag every DAG of avsim carries (avsim.dagbuild).
AVSIM_TAG = "avsim"


def avsim_dags(session: Session, dag_ids: Iterable[str]) -> set[str]:
    """Those of ``dag_ids`` that are avsim's."""
    wanted = set(dag_ids)
    if not wanted:
        return set()
    DagTag = airflow_internals.models()["DagTag"]
    return set(
        session.scalars(select(DagTag.dag_id).where(DagTag.name == AVSIM_TAG, DagTag.dag_id.in_(wanted)))
    )


def is_avsim_dag(session: Session, dag_id: str) -> bool:
    return dag_id in avsim_dags(session, [dag_id])
