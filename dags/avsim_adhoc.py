"""Ad-hoc simulation runs (an Airflow DAG): the weekly run's DAG shape and pools, at lower priority than the weekly run.

Built from the same graph catalog as the weekly DAGs (avsim_graphs.yaml next to this file).
"""

from pathlib import Path

from avsim.dagbuild.factory import load_weekly_dags
from avsim.manifest.models import RunClass

globals().update(
    load_weekly_dags(
        catalog=Path(__file__).with_name("avsim_graphs.yaml"),
        dag_id="avsim_adhoc",
        part="parent",
        run_class=RunClass.ADHOC,
    )
)
