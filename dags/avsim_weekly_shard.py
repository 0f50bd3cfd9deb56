"""The avsim shard DAG: one Airflow DAG run per shard of a weekly run, started by avsim_weekly.

One mapped task group per graph of the catalog next to this file, one task per phase.
"""

from pathlib import Path

from avsim.dagbuild.factory import shard_dags

globals().update(shard_dags(Path(__file__).with_name("avsim_graphs.yaml")))
