"""A Kubernetes phase started through the real operator up to its deferral, against the loopback
Kubernetes API: the prepared week, the worker's task instance, the phase's start, and what the
tests of a user's kill read back (the ledger, the namespace's pods and Leases, a process)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from airflow.sdk.exceptions import TaskDeferred
from tests.support.kube_api import FakeKubeAPI

from avsim.dagbuild import tasks
from avsim.dagbuild.factory import load_plan
from avsim.dagbuild.prepare import prepare_week
from avsim.manifest.sample import sample_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.settings import AvsimSettings, KubernetesSettings

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "sims"
DAG_ID, TASK_ID, RUN_ID, MAP_INDEX = "avsim_weekly_shard", "standard.prepare", "manual__w1", 0


class PhaseTI:
    """The worker's task instance, as the operator reads it before it defers."""

    dag_id, task_id, run_id, map_index, max_tries = DAG_ID, TASK_ID, RUN_ID, MAP_INDEX, 3

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.start_date = dt.datetime.now(dt.UTC)

    def xcom_push(self, key: str, value: Any) -> None:
        pass


def prepared_week(tmp_path: Path, time_scale: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the run descriptor, a standard case) of a prepared week (``time_scale`` 1: a 3-minute prepare)."""
    settings = AvsimSettings(shard_size=4, artifact_root=f"file://{tmp_path / 'artifacts'}")
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(sample_manifest(2, time_scale=time_scale, scenario_fail_rate=0.0)))
    prepared = prepare_week(
        source=str(path), plan=plan, settings=settings, dag_id="avsim_weekly", run_id="w1"
    )
    loaded = tasks.load_shard(prepared["shards"][0]["conf"], plan)
    return prepared["run"], loaded["cases_standard"][0]


def start_phase(run: dict[str, Any], case: dict[str, Any], try_number: int) -> Any:
    """One try of the case's prepare phase up to its deferral: its trigger."""
    op = KubernetesPhaseOperator(
        task_id=TASK_ID,
        phase="prepare",
        case=case,
        run=run,
        kube=KubernetesSettings(conn_id="avsim_kube", namespace=NAMESPACE),
        retries=3,
    )
    ti = PhaseTI(try_number)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti, "run_id": RUN_ID, "dag": type("Dag", (), {"dag_id": DAG_ID})()})
    trigger = deferred.value.trigger
    trigger.min_wait_seconds, trigger.check_interval = 0.0, 0.2
    return trigger


def ledger_of(run: dict[str, Any]) -> Any:
    from avsim.contracts import RunDescriptor
    from avsim.ledger.store import Ledger

    return Ledger(RunDescriptor.model_validate(run).layout)


def next_try_settles_the_killed_attempt(
    kube: FakeKubeAPI, run: dict[str, Any], case: dict[str, Any], ledger: Any
) -> Any:
    """Start the phase's try 2 (the try a clear starts) and check it recorded the killed attempt 1 as
    lost (infra_failed/abandoned) and runs attempt 2 in a pod of its own, the only one. Returns it."""
    retry = start_phase(run, case, try_number=2)
    first, second = ledger.attempts(case["case_id"], "prepare")
    assert (first.state, first.outcome.value if first.outcome else None, first.detail) == (
        "ended",
        "infra_failed",
        "abandoned",
    )
    assert (second.attempt, second.state, retry.attempt) == (2, "started", 2)
    assert names(kube, "pods") == {retry.pod_name}
    return retry


def names(kube: FakeKubeAPI, kind: str) -> set[str]:
    found = kube.pods(NAMESPACE) if kind == "pods" else kube.leases(NAMESPACE)
    return {o["metadata"]["name"] for o in found}


def running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


PY = sys.executable


def pod_body(
    name: str,
    code: str = "pass",
    *,
    labels: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "base", "image": "avsim/sim:1", "command": [PY, "-c", code]}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


SLEEP = "import time; time.sleep(60)"
