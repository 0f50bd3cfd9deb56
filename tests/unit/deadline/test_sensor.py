"""The tracker sensor's side: what it defers with, and what it does with each event of its trigger.

The events are the trigger's (see test_trigger.py); acting scales a node group on moto's
EKS server through the real EksHook, and the action is recorded in a ``file://`` artifact store.
"""

from __future__ import annotations

import json
import types
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from airflow.sdk.exceptions import TaskDeferred

from avsim.dagbuild.factory import load_plan
from avsim.deadline.actions import ActionResult
from avsim.deadline.sensor import (
    OFF,
    DeadlineTrackerError,
    DeadlineTrackerSensor,
    deadline_tracker,
    summarize,
)
from avsim.deadline.trigger import DeadlineTrackerTrigger
from avsim.settings import AvsimSettings, DeadlineSettings

ROOT = Path(__file__).resolve().parents[3]


def _run(tmp_path: Path) -> dict[str, Any]:
    return {
        "run_key": "avsim_weekly__w49",
        "artifact_root": f"file://{tmp_path}",
        "dag_id": "avsim_weekly",
        "run_id": "w49",
        "shard_count": 4,
        "canary_count": 0,
    }


def _sensor(tmp_path: Path, settings: AvsimSettings) -> DeadlineTrackerSensor:
    plan = load_plan(ROOT / "dags" / "avsim_graphs.yaml", settings)
    return deadline_tracker(plan, settings, run=_run(tmp_path), shard_dag_id="avsim_weekly_shard")


def _deferred(call: Any) -> DeadlineTrackerTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        call()
    trigger = deferred.value.trigger
    assert isinstance(trigger, DeadlineTrackerTrigger)
    assert deferred.value.method_name == "execute_complete"
    return trigger


def test_built_from_the_plan_and_settings(tmp_path: Path) -> None:
    settings = AvsimSettings(deadline=DeadlineSettings(interval_seconds=120, default_hours=100))
    sensor = _sensor(tmp_path, settings)
    from avsim.plan.priority_rule import WEEKLY_BASE
    from avsim.retries import CONTROL_RETRIES

    assert sensor.task_id == "deadline_tracker" and sensor.retries == CONTROL_RETRIES
    assert sensor.priority_weight == 2 * WEEKLY_BASE  # bookkeeping: above every phase of the week
    assert sensor.phases["standard.simulate"]["twin"] == "standard.simulate_on_demand"
    assert not sensor.scaling.enabled
    trigger = _deferred(lambda: sensor.execute({}))
    _, kwargs = trigger.serialize()
    assert kwargs["act_above_gpus"] is None and kwargs["action"] == OFF
    assert kwargs["interval_seconds"] == 120 and kwargs["gpu_capacity"] == 0
    assert kwargs["run"]["shard_count"] == 4 and kwargs["run"]["canary"] is False


def test_done_returns_the_last_estimate_and_errors_fail_the_task(tmp_path: Path) -> None:
    sensor = _sensor(tmp_path, AvsimSettings())
    assert sensor.execute_complete({}, {"status": "done", "estimate": {"reason": "on track"}}) == {
        "reason": "on track"
    }
    with pytest.raises(DeadlineTrackerError, match=r"avsim_weekly__w49 stopped: plan\.json is gone"):
        sensor.execute_complete({}, {"status": "error", "message": "plan.json is gone"})


def test_a_late_event_scales_records_and_defers_again(
    tmp_path: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_AVSIM_AWS", json.dumps({"conn_type": "aws", "extra": {"endpoint_url": s3_server}})
    )
    urllib.request.urlopen(urllib.request.Request(f"{s3_server}/moto-api/reset", method="POST"), timeout=30)
    eks = boto3.client("eks", endpoint_url=s3_server)
    eks.create_cluster(
        name="sim", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": ["s"]}
    )
    eks.create_nodegroup(
        clusterName="sim",
        nodegroupName="gpu",
        nodeRole="arn:aws:iam::123456789012:role/node",
        subnets=["s"],
        scalingConfig={"minSize": 1, "maxSize": 4, "desiredSize": 2},
    )
    settings = AvsimSettings(
        deadline=DeadlineSettings(
            aws_conn_id="avsim_aws", eks_cluster="sim", eks_nodegroup="gpu", eks_max_nodes=5, gpus_per_node=8
        )
    )
    sensor = _sensor(tmp_path, settings)
    first = _deferred(lambda: sensor.execute({}))
    assert first.serialize()[1]["act_above_gpus"] == 0, (
        "acting is configured: any late estimate is handed over"
    )

    event = {
        "status": "late",
        "gpus_needed": 30,
        "estimate": {"seconds_late": 5400.0, "reason": "late by 1.5 h"},
    }
    again = _deferred(lambda: sensor.execute_complete({}, event))
    _, kwargs = again.serialize()
    assert kwargs["act_above_gpus"] == 30, "the next event only for more GPUs than asked for now"
    assert kwargs["action"] == "30 GPUs needed: sim/gpu 2 -> 4"
    scaling = eks.describe_nodegroup(clusterName="sim", nodegroupName="gpu")["nodegroup"]["scalingConfig"]
    assert scaling["desiredSize"] == 4  # ceil(30 / 8)
    [recorded] = list((tmp_path / "runs" / "avsim_weekly__w49" / "deadline" / "actions").glob("*.json"))
    doc = json.loads(recorded.read_text())
    assert doc["gpus_needed"] == 30 and doc["estimate"]["seconds_late"] == 5400.0
    assert [(r["action"], r["outcome"], r["before"], r["after"]) for r in doc["results"]] == [
        ("node_group", "raised", 2, 4)
    ]


def test_the_run_must_be_the_descriptor(tmp_path: Path) -> None:
    sensor = DeadlineTrackerSensor(task_id="t", run="{{ nothing }}", shard_dag_id="s", phases={})
    with pytest.raises(DeadlineTrackerError, match="XCom 'run'"):
        sensor.execute({})


def test_summary_of_actions() -> None:
    raised = ActionResult("pool_slots", "avsim_gpu_spot", "raised", 8, 12, "")
    failed = ActionResult("node_group", "sim/gpu", "failed", None, None, "AccessDenied")
    assert (
        summarize(14, [raised, failed])
        == "14 GPUs needed: avsim_gpu_spot 8 -> 12; sim/gpu failed (AccessDenied)"
    )
    assert summarize(14, []) == "14 GPUs needed: no action configured"


def test_every_deferral_of_the_gate_and_the_tracker_has_a_timeout() -> None:
    """A deferral without a timeout can wait forever in the triggerer (issue 13): both sensors bound
    theirs by their own ``timeout``."""
    from avsim.sensors.canary_gate import CanaryGateSensor

    run = {
        "run_key": "avsim_weekly__r",
        "artifact_root": "file:///tmp/avsim-nowhere",
        "dag_id": "avsim_weekly",
        "run_id": "r",
        "shard_count": 2,
    }
    canary = {
        "cases": {"c1": ["prepare"]},
        "threshold": 0.2,
        "trigger_run_id": "r__canary",
        "conf": {"run": run, "shard": 0},
    }
    gate = CanaryGateSensor(task_id="canary_gate", run=run, canary=canary, timeout=3600)
    tracker = DeadlineTrackerSensor(task_id="deadline", run=run, shard_dag_id="avsim_weekly_shard", phases={})
    # The gate reads its try's round from its task instance (the week's first round here).
    first_try = {
        "ti": types.SimpleNamespace(max_tries=0, try_number=1, dag_id="avsim_weekly"),
        "dag_run": types.SimpleNamespace(run_id="r"),
    }
    for sensor, expected in ((gate, 3600), (tracker, 14 * 24 * 3600)):
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute(first_try)
        assert deferred.value.timeout is not None
        assert deferred.value.timeout.total_seconds() == expected, sensor.task_id
