"""Scaling an EKS managed node group through the amazon provider's EksHook, against moto's server.

moto implements the EKS calls the action makes (``describe_nodegroup``,
``update_nodegroup_config`` with ``scalingConfig``), so the hook, boto3 and the HTTP requests
are the real ones. The pool action, which needs a real Airflow API server, is tested in
``tests/integration/test_deadline_actions.py``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import boto3
import pytest

from avsim.deadline.actions import ActionResult, ScalingPolicy, act, scale_node_group, spot_gpus_wanted

CLUSTER, GROUP = "sim", "gpu-spot"


@pytest.fixture
def eks(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An EKS cluster with a GPU spot node group (4 nodes, at most 10) on the moto server."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_AVSIM_AWS",
        json.dumps({"conn_type": "aws", "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}),
    )
    # moto keeps its state per process, across server instances: start from a clean one.
    urllib.request.urlopen(urllib.request.Request(f"{s3_server}/moto-api/reset", method="POST"), timeout=30)
    client = boto3.client("eks", endpoint_url=s3_server)
    client.create_cluster(
        name=CLUSTER,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": ["subnet-1"]},
    )
    client.create_nodegroup(
        clusterName=CLUSTER,
        nodegroupName=GROUP,
        nodeRole="arn:aws:iam::123456789012:role/node",
        subnets=["subnet-1"],
        scalingConfig={"minSize": 0, "maxSize": 10, "desiredSize": 4},
        capacityType="SPOT",
        instanceTypes=["g5.12xlarge"],
    )
    yield client


def _scaling(client: object) -> dict[str, int]:
    group = client.describe_nodegroup(clusterName=CLUSTER, nodegroupName=GROUP)  # type: ignore[attr-defined]
    return dict(group["nodegroup"]["scalingConfig"])


def _policy(**kwargs: object) -> ScalingPolicy:
    base = {
        "aws_conn_id": "avsim_aws",
        "eks_cluster": CLUSTER,
        "eks_nodegroup": GROUP,
        "eks_max_nodes": 20,
        "gpus_per_node": 4,
    }
    return ScalingPolicy(**{**base, **kwargs})  # type: ignore[arg-type]


def test_raises_desired_size_to_cover_the_gpus_needed(eks: object) -> None:
    # 44 GPUs needed, 4 of them on demand: 40 spot GPUs at 4 a node = 10 nodes (max already 10).
    result = scale_node_group(_policy(), 44, on_demand_gpus=4)
    assert result == ActionResult(
        "node_group",
        "sim/gpu-spot",
        "raised",
        4,
        10,
        "44 GPUs needed at 4 per node: desired size 4 -> 10",
    )
    assert _scaling(eks) == {"minSize": 0, "maxSize": 10, "desiredSize": 10}


def test_raises_max_size_when_the_new_size_needs_it(eks: object) -> None:
    result = scale_node_group(_policy(), 57)  # ceil(57 / 4) = 15 nodes
    assert (result.outcome, result.after) == ("raised", 15)
    assert _scaling(eks) == {"minSize": 0, "maxSize": 15, "desiredSize": 15}


def test_never_beyond_its_bound(eks: object) -> None:
    result = scale_node_group(_policy(eks_max_nodes=8), 400)
    assert (result.outcome, result.before, result.after) == ("raised", 4, 8)
    assert result.detail.endswith("(capped by eks_max_nodes)")
    assert _scaling(eks)["desiredSize"] == 8
    at_bound = scale_node_group(_policy(eks_max_nodes=8), 400)
    assert (at_bound.outcome, at_bound.detail) == ("unchanged", "the bound eks_max_nodes=8 is reached")


def test_never_scales_down(eks: object) -> None:
    result = scale_node_group(_policy(), 6)  # 2 nodes would do; 4 run
    assert (result.outcome, result.detail) == ("unchanged", "4 nodes already cover the 6 GPUs needed")
    assert _scaling(eks)["desiredSize"] == 4


def test_act_reports_a_failing_action_instead_of_raising(eks: object) -> None:
    results = act(_policy(eks_nodegroup="gpu-spot-typo"), 44)
    assert [(r.action, r.target, r.outcome) for r in results] == [
        ("node_group", "sim/gpu-spot-typo", "failed")
    ]
    assert "ResourceNotFoundException" in results[0].detail
    assert _scaling(eks)["desiredSize"] == 4


def test_nothing_configured_does_nothing() -> None:
    policy = ScalingPolicy()
    assert not policy.enabled and act(policy, 1000) == []
    assert not ScalingPolicy(api_conn_id="airflow_api").pool_enabled, "no bound, no raise"
    assert not ScalingPolicy(eks_cluster="c", eks_nodegroup="g").eks_enabled


def test_spot_gpus_wanted() -> None:
    assert spot_gpus_wanted(44, 4) == 40
    assert spot_gpus_wanted(3, 4) == 0
