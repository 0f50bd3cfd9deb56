"""Every pod spec and Lease avsim builds is one the real API servers of the supported Kubernetes
versions accept, in strict mode (no unknown field): their OpenAPI schemas, from kubernetes-validate.

The pods come from :func:`avsim.kube.pod_spec.phase_pod`, for every node class, each run class
(weekly, adhoc, the canary shard run), checkpoints on and off, the on-demand twin of a GPU phase
and the manifest's boldest pod overrides, and one as the operator sends it (with the task
instance's labels, ``dry_run``: no API); the Lease from :func:`avsim.kube.pods.lease_body`. Both
are serialized as the kubernetes client sends them (``ApiClient().sanitize_for_serialization``).
"""

from __future__ import annotations

import copy
import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient
from tests.support.kube_api.schema import SUPPORTED_VERSIONS, violations
from tests.support.kube_settings import KUBE

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.contracts.case import CaseEntry
from avsim.kube import pod_spec, pods
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT

POD_OVERRIDES: dict[str, Any] = {
    "labels": {"example.com/variant": "overrides"},
    "annotations": {"example.com/owner": "team-sim"},
    "env": {"LD_LIBRARY_PATH": "/opt/sim/lib"},
    "ephemeral_storage": "200Gi",
    "shm_size": "64Gi",
}
#: Where the runs of these pods keep their artifacts.
ARTIFACTS = "s3://avsim_s3@avsim-artifacts/avsim"
#: GPUs of the phase each node class runs: GPU phases on spot, their on-demand twin, CPU phases.
PLACEMENTS = {NODE_SPOT: 1, NODE_ON_DEMAND: 1, NODE_CPU: 0}
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


def attempt_for(node_class: str, run: str, *, checkpoint: bool, overrides: bool) -> PhaseAttempt:
    """What begin_attempt returns for attempt 2 (see tests/unit/kube/test_pod_spec_security.py)."""
    gpus = PLACEMENTS[node_class]
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
    attempt = PhaseAttempt(
        layout=RunLayout(ARTIFACTS, f"avsim_{run_class}__{run_id}"),
        case=CaseEntry(case_id=case.id, seed=case.seed, parameters=case.parameters),
        phase=phase,
        attempt=2,
        runtime=PhaseRuntime.from_spec(spec),
        build_id=m.run.build.build_id,
        image=m.run.build.image,
        inputs={"prepare": "s3://avsim_s3@avsim-artifacts/avsim/runs/x/cases/c/prepare/attempt-1"},
        node_class=node_class,
    )
    assert bool(attempt.checkpoint_uri) == checkpoint
    return attempt


def build(
    node_class: str, run: str, *, checkpoint: bool, overrides: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    attempt = attempt_for(node_class, run, checkpoint=checkpoint, overrides=overrides)
    run_class, run_id = RUNS[run]
    pod = pod_spec.phase_pod(
        attempt, namespace="avsim", priority=pod_spec.priority_key(run_class, run_id), kube=KUBE
    )
    labels = pods.attempt_labels(attempt.layout.run_key, attempt.case_id, attempt.phase, 2, node_class)
    lease = pods.lease_body(pod.metadata.name, "avsim", labels, attempt.runtime.lease_seconds)
    return _sent(pod), lease


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


@pytest.mark.parametrize("node_class", PLACEMENTS)
def test_the_pod_the_operator_sends_is_valid_too(node_class: str) -> None:
    """With what the stock operator adds (the task instance's identifying labels, Airflow's version)."""
    attempt = attempt_for(node_class, "canary", checkpoint=True, overrides=True)
    run_class, run_id = RUNS["canary"]
    op = KubernetesPhaseOperator(
        task_id=f"standard.{attempt.phase}",
        phase=attempt.phase,
        case={"case_id": attempt.case_id},
        run={"run_key": attempt.layout.run_key, "artifact_root": ARTIFACTS, "run_class": run_class},
        gpus=PLACEMENTS[node_class],
        kube=KUBE,
    )
    ti = SimpleNamespace(dag_id=f"avsim_{run_class}_shard", task_id=op.task_id, map_index=3, try_number=2)
    sent = _sent(
        op.attempt_pod(attempt, {"ti": ti, "run_id": run_id, "dag": SimpleNamespace()}, dry_run=True)
    )
    assert violations(sent) == []
    assert sent["metadata"]["labels"]["map_index"] == "3"
    assert sent["spec"]["priorityClassName"] == KUBE.priority_classes["canary"]
