"""The one DAG file of a deployment (docs/install.md): four DAGs, or the one a worker parses for."""

from __future__ import annotations

from pathlib import Path

import pytest

from avsim.dagbuild.deployed import DAGS, avsim_dags

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__AVSIM__GRAPH_CATALOG", str(ROOT / "dags" / "avsim_graphs.yaml"))
    monkeypatch.delenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", raising=False)


def test_the_file_holds_the_four_dags_the_repositorys_files_build() -> None:
    dags = avsim_dags()
    assert (
        sorted(dags)
        == sorted(DAGS)
        == ["avsim_adhoc", "avsim_adhoc_shard", "avsim_weekly", "avsim_weekly_shard"]
    )
    assert {d.dag_id for d in dags.values()} == set(DAGS)


def test_a_worker_parsing_for_one_dag_builds_only_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "avsim_weekly_shard")
    assert list(avsim_dags()) == ["avsim_weekly_shard"]
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "someone_elses_dag")
    assert sorted(avsim_dags()) == sorted(DAGS)
