"""The avsim weekly regression run: the parent Airflow DAG, built from the graph catalog.

The catalog next to this file (avsim_graphs.yaml) shapes the DAGs; cases come from the
weekly manifest at run time, so parsing this file does not depend on how many cases a week has.
"""

from pathlib import Path

from avsim.dagbuild.factory import load_weekly_dags

globals().update(load_weekly_dags(catalog=Path(__file__).with_name("avsim_graphs.yaml"), part="parent"))
