"""Test-wide setup: a throwaway AIRFLOW_HOME so no test reads or writes a user's Airflow."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_home = Path(tempfile.mkdtemp(prefix="avsim-test-airflow-"))
os.environ.setdefault("AIRFLOW_HOME", str(_home))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(ROOT / "plugins"))
os.environ.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{_home / 'airflow.db'}")
sys.path.insert(0, str(ROOT))
