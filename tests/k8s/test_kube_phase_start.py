"""What a Kubernetes phase's start costs the cluster and the execution API, against the loopback API.

A real prepared run on a ``file://`` ledger, the real operator and its hook talking HTTP to the
loopback Kubernetes API (:class:`tests.support.kube_api.FakeKubeAPI`, which counts the requests it
serves). The boundary: Airflow's task instance is a stand-in holding what the operator reads (try
number, identifying labels) and an XCom table that records every push, each of which would be an
execution-API call.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.kube_api import FakeKubeAPI

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.kube import pods
from avsim.manifest.sample import sample_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.settings import AvsimSettings, KubernetesSettings

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "sims"


class PhaseTI:
    """The task instance's stand-in: identifying labels, try number, and the XComs pushed."""

    dag_id = "avsim_weekly_shard"
    task_id = "standard.prepare"
    run_id = "manual__w1"
    map_index = 0
    max_tries = 3

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.start_date = dt.datetime.now(dt.UTC)
        self.pushed: list[str] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append(key)


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(workdir=tmp_path / "kube") as api:
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        for key, value in api.airflow_conn_env("avsim_kube", config, namespace=NAMESPACE).items():
            monkeypatch.setenv(key, value)
        yield api
    assert api.errors == []


@pytest.fixture
def shard_phase(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run descriptor, a case) of a prepared week."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(sample_manifest(2)))
    prepared = tasks.prepare_week(source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1")
    loaded = tasks.load_shard(prepared["shards"][0]["conf"], plan)
    family = next(k for k, v in loaded.items() if k.startswith("cases_") and v)
    return prepared["run"], loaded[family][0]


def start(run: dict[str, Any], case: dict[str, Any], try_number: int) -> tuple[PhaseTI, Any]:
    """One try of the case's prepare phase up to its deferral: (the task instance, the trigger)."""
    op = KubernetesPhaseOperator(
        task_id="standard.prepare",
        phase="prepare",
        case=case,
        run=run,
        kube=KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE),
        retries=3,
    )
    ti = PhaseTI(try_number)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti, "run_id": ti.run_id, "dag": type("Dag", (), {"dag_id": ti.dag_id})()})
    return ti, deferred.value.trigger


def test_a_first_attempt_creates_its_pod_and_lease_and_defers_with_nothing_else(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """Attempt 1 has no earlier attempt's pod to look for, and pushes no XCom: the pod's name is the
    attempt's (the ledger's runner), so the stock operator's ``pod_name``/``pod_namespace`` are not sent."""
    run, case = shard_phase
    ti, trigger = start(run, case, try_number=1)
    name = pods.pod_name(run["run_key"], case["case_id"], "prepare", 1)
    assert (trigger.pod_name, trigger.namespace, trigger.attempt) == (name, NAMESPACE, 1)
    assert [p["metadata"]["name"] for p in kube.pods(NAMESPACE)] == [name]
    assert ti.pushed == []
    assert kube.call_count(verb="create", resource="pods") == 1
    assert kube.call_count(verb="create", resource="leases") == 1
    assert kube.call_count(verb="list") == 0, kube.calls()


def test_a_later_attempt_deletes_the_earlier_attempts_pod_first(
    kube: FakeKubeAPI, shard_phase: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """A retry's attempt 2 lists the phase's pods and deletes attempt 1's before creating its own."""
    run, case = shard_phase
    start(run, case, try_number=1)
    kube.reset_calls()
    _, trigger = start(run, case, try_number=2)
    assert trigger.attempt == 2
    assert kube.call_count(verb="list", resource="pods") == 1
    assert kube.call_count(verb="delete", resource="pods") == 1
    first = pods.pod_name(run["run_key"], case["case_id"], "prepare", 1)
    assert first not in {p["metadata"]["name"] for p in kube.pods(NAMESPACE) if not p["metadata"].get("deletionTimestamp")}
