"""The shard Airflow DAG of ad-hoc runs: started by avsim_adhoc, one mapped task group per graph family."""

from pathlib import Path

from avsim.dagbuild.factory import load_weekly_dags

globals().update(
    load_weekly_dags(
        catalog=Path(__file__).with_name("avsim_graphs.yaml"),
        dag_id="avsim_adhoc",
        part="shard",
        run_class="adhoc",
    )
)
