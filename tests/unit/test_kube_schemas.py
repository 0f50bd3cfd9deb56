"""Every pod spec and Lease avsim builds is one the real API servers of the supported Kubernetes
versions accept, in strict mode (no unknown field): their OpenAPI schemas, from kubernetes-validate.

The pods come from ``KubernetesPhaseOperator.build_pod_request_obj`` (``dry_run``: no API), for
every node class, each run class (weekly, adhoc, the canary shard run), checkpoints on and off, the
on-demand twin of a GPU phase and the manifest's boldest pod overrides; the Lease from the
operator's ``lease_request_obj``. Both are serialized as the kubernetes client sends them
(``ApiClient().sanitize_for_serialization``).
"""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient
from tests.support.kube_api.schema import SUPPORTED_VERSIONS, violations

from avsim.artifacts import RunLayout
from avsim.kube import pods
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.phases.attempt import PhaseAttempt, PhaseRuntime
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT
from avsim.phases.policy import Role
from avsim.settings import KubernetesSettings

KUBE = KubernetesSettings(
    run_as_user=4242,
    node_classes={
        NODE_SPOT: {
            "node_selector": {"avsim.io/capacity": "spot", "nvidia.com/gpu.present": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            ],
        },
        NODE_ON_DEMAND: {
            "node_selector": {"avsim.io/capacity": "on-demand"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        NODE_CPU: {"node_selector": {"avsim.io/pool": "cpu"}},
    },
    priority_classes={"canary": "avsim-canary", "weekly": "avsim-weekly", "adhoc": "avsim-adhoc"},
)
POD_OVERRIDES: dict[str, Any] = {
    "labels": {"example.com/variant": "overrides"},
    "annotations": {"example.com/owner": "team-sim"},
    "env": {"LD_LIBRARY_PATH": "/opt/sim/lib"},
    "ephemeral_storage": "200Gi",
    "shm_size": "64Gi",
}
#: (gpus, role) of each node class: GPU phases on spot, their on-demand twin, CPU phases.
PLACEMENTS = {NODE_SPOT: (1, Role.SPOT), NODE_ON_DEMAND: (1, Role.ON_DEMAND), NODE_CPU: (0, Role.REGULAR)}
RUNS = {
    "weekly": ("weekly", "scheduled__2026-11-30__shard_0001"),
    "adhoc": ("adhoc", "manual__2026-12-01__shard_0000"),
    "canary": ("weekly", "scheduled__2026-11-30__canary"),
}


def _sent(obj: Any) -> dict[str, Any]:
    """What the kubernetes client puts on the wire."""
    body = ApiClient().sanitize_for_serialization(obj)
    assert isinstance(body, dict)
    return body


def build(
    node_class: str, run: str, *, checkpoint: bool, overrides: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    gpus, role = PLACEMENTS[node_class]
    phase = "simulate" if gpus else "prepare"  # a GPU phase, or a CPU one
    doc = sample_manifest(2, iso_week="2026-W49")
    phase_doc = doc["graphs"]["standard"]["phases"][phase]
    phase_doc["checkpoint"] = checkpoint
    if overrides:
        phase_doc["pod"] = copy.deepcopy(POD_OVERRIDES)
    m = validate_manifest(doc)
    spec = m.graphs["standard"].phases[phase].model_dump(mode="json", by_alias=True)
    run_class, run_id = RUNS[run]
    case = m.cases[0]
    run_doc = {
        "run_key": f"avsim_{run_class}__{run_id}",
        "artifact_root": "s3://avsim_s3@avsim-artifacts/avsim",
        "build_id": m.run.build.build_id,
        "image": m.run.build.image,
        "run_class": run_class,
    }
    op = KubernetesPhaseOperator(
        task_id=f"standard.{phase}" + ("_on_demand" if role == Role.ON_DEMAND else ""),
        phase=phase,
        case={"case_id": case.id, "seed": case.seed},
        run=run_doc,
        gpus=gpus,
        role=role,
        kube=KUBE,
    )
    assert op.node_class == node_class
    attempt = PhaseAttempt(  # what begin_attempt returns for attempt 2 (see test_pod_security.py)
        layout=RunLayout(run_doc["artifact_root"], run_doc["run_key"]),
        case={"case_id": case.id, "seed": case.seed, "parameters": case.parameters},
        phase=phase,
        attempt=2,
        runtime=PhaseRuntime.from_spec(spec),
        build_id=run_doc["build_id"],
        image=run_doc["image"],
        inputs={"prepare": "s3://avsim_s3@avsim-artifacts/avsim/runs/x/cases/c/prepare/attempt-1"},
        node_class=op.node_class,
    )
    assert bool(attempt.checkpoint_uri) == checkpoint
    op._attempt = attempt
    op._run_id = run_id
    op.name = pods.pod_name(run_doc["run_key"], case.id, phase, 2)
    ti = SimpleNamespace(dag_id=f"avsim_{run_class}_shard", task_id=op.task_id, map_index=3, try_number=2)
    pod = _sent(
        op.build_pod_request_obj({"ti": ti, "run_id": run_id, "dag": SimpleNamespace()}, dry_run=True)
    )
    lease = op.lease_request_obj(attempt, "avsim", op.name)
    return pod, lease


CASES = [
    pytest.param(
        node_class,
        run,
        checkpoint,
        overrides,
        id=f"{node_class}-{run}-ckpt{int(checkpoint)}-ov{int(overrides)}",
    )
    for node_class, run, checkpoint, overrides in itertools.product(
        PLACEMENTS, RUNS, (False, True), (False, True)
    )
]


@pytest.mark.parametrize(("node_class", "run", "checkpoint", "overrides"), CASES)
def test_every_pod_and_lease_avsim_builds_is_valid_on_every_supported_kubernetes(
    node_class: str, run: str, checkpoint: bool, overrides: bool
) -> None:
    pod, lease = build(node_class, run, checkpoint=checkpoint, overrides=overrides)
    assert violations(pod) == []
    assert violations(lease) == []
    # The pieces each variant is about are really in what was checked.
    spec = pod["spec"]
    assert spec["priorityClassName"] == KUBE.priority_classes["canary" if run == "canary" else RUNS[run][0]]
    assert spec["nodeSelector"] == KUBE.node_classes[node_class]["node_selector"]
    resources = spec["containers"][0]["resources"]
    assert ("nvidia.com/gpu" in resources["limits"]) == (node_class != NODE_CPU)
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert bool(env.get("CHECKPOINT_URI")) == checkpoint
    assert (pod["metadata"]["labels"].get("example.com/variant") == "overrides") == overrides
    assert spec["securityContext"]["appArmorProfile"] == {"type": "RuntimeDefault"}
    assert lease["spec"]["holderIdentity"] == pod["metadata"]["name"]


def test_the_check_is_strict_and_knows_each_versions_fields() -> None:
    """It catches what a real server refuses: an unknown field, a wrong type, a field from a newer
    Kubernetes than a supported one (so the supported range is what the check really enforces)."""
    pod, lease = build(NODE_SPOT, "weekly", checkpoint=True, overrides=True)
    bad = copy.deepcopy(pod)
    bad["spec"]["containers"][0]["gpuCount"] = 1
    assert any("spec.containers[0]" in v and "gpuCount" in v for v in violations(bad))
    bad = copy.deepcopy(lease)
    bad["spec"]["leaseDurationSeconds"] = "five"
    assert any("spec.leaseDurationSeconds" in v for v in violations(bad))
    # appArmorProfile (1.30) is unknown to 1.29: the floor of SUPPORTED_VERSIONS is not arbitrary.
    assert SUPPORTED_VERSIONS[0] == "1.30"
    assert any("appArmorProfile" in v for v in violations(pod, ["1.29"]))
