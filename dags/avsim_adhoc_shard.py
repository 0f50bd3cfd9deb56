"""The shard Airflow DAG of ad-hoc runs: started by avsim_adhoc, one mapped task group per graph family."""

from pathlib import Path

from avsim.dagbuild.factory import shard_dags
from avsim.manifest.models import RunClass

globals().update(shard_dags(Path(__file__).with_name("avsim_graphs.yaml"), "avsim_adhoc", RunClass.ADHOC))
