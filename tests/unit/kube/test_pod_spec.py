"""The phase pod as data (avsim.kube.pod_spec): what each input changes, with no operator and no API.

The attempts are built from the sample manifest's validated phase specs through
``PhaseRuntime.from_spec``, as ``begin_attempt`` builds them from a run's snapshot.
``test_pod_spec_security.py`` checks the sandbox against the boldest manifest;
``test_pod_spec_schemas.py`` checks every variant against the Kubernetes API's schemas.
"""

from __future__ import annotations

from typing import Any

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.contracts.case import CaseEntry
from avsim.kube import pods
from avsim.kube.pod_spec import SCRATCH_MOUNT, phase_pod, priority_key
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.phases import contract
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT
from avsim.settings import KubernetesSettings

KUBE = KubernetesSettings(
    service_account="sim-runner",
    run_as_user=2000,
    node_classes={
        NODE_SPOT: {
            "node_selector": {"capacity": "spot"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
        },
        NODE_ON_DEMAND: {"node_selector": {"capacity": "on-demand"}},
        NODE_CPU: {"node_selector": {"pool": "cpu"}},
    },
    priority_classes={"canary": "p-canary", "weekly": "p-weekly", "adhoc": ""},
)


def attempt(phase: str = "simulate", node_class: str = NODE_SPOT, **spec_changes: Any) -> PhaseAttempt:
    doc = sample_manifest(2, iso_week="2026-W49")
    doc["graphs"]["standard"]["phases"][phase].update(spec_changes)
    m = validate_manifest(doc)
    spec = m.graphs["standard"].phases[phase].model_dump(mode="json", by_alias=True)
    case = m.cases[0]
    return PhaseAttempt(
        layout=RunLayout("file:///art", "avsim_weekly__manual__1"),
        case=CaseEntry(case_id=case.id, seed=case.seed, parameters=case.parameters),
        phase=phase,
        attempt=3,
        runtime=PhaseRuntime.from_spec(spec),
        build_id=m.run.build.build_id,
        image=m.run.build.image,
        node_class=node_class,
    )


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env}


def test_the_canary_shard_run_has_its_own_priority_class() -> None:
    assert priority_key("weekly", "manual__1__canary") == "canary"
    assert priority_key("weekly", "manual__1__shard_0002") == "weekly"
    assert priority_key("adhoc", "manual__1__shard_0001") == "adhoc"
    a = attempt()
    classes = {
        key: phase_pod(a, namespace="ns", priority=key, kube=KUBE).spec.priority_class_name
        for key in ("canary", "weekly", "adhoc")
    }
    assert classes == {"canary": "p-canary", "weekly": "p-weekly", "adhoc": None}  # "" sets none


def test_the_node_class_places_the_pod_and_the_twin_runs_on_demand() -> None:
    spot = phase_pod(attempt(node_class=NODE_SPOT), namespace="ns", priority="weekly", kube=KUBE)
    twin = phase_pod(attempt(node_class=NODE_ON_DEMAND), namespace="ns", priority="weekly", kube=KUBE)
    assert spot.spec.node_selector == {"capacity": "spot"} and [t.key for t in spot.spec.tolerations] == [
        "spot"
    ]
    assert twin.spec.node_selector == {"capacity": "on-demand"} and twin.spec.tolerations == []
    assert spot.metadata.labels[pods.LABEL_NODE_CLASS] == NODE_SPOT
    assert twin.metadata.labels[pods.LABEL_NODE_CLASS] == NODE_ON_DEMAND
    assert env_of(twin)[contract.ENV_NODE_CLASS] == NODE_ON_DEMAND
    # the same attempt of the same phase: the same pod name, so the twin's replaces the spot one's
    assert spot.metadata.name == twin.metadata.name
    for pod in (spot, twin):
        res = pod.spec.containers[0].resources
        assert res.requests["nvidia.com/gpu"] == res.limits["nvidia.com/gpu"] == "1"


def test_a_cpu_phase_asks_for_no_gpu() -> None:
    pod = phase_pod(attempt("prepare", NODE_CPU), namespace="ns", priority="weekly", kube=KUBE)
    res = pod.spec.containers[0].resources
    assert "nvidia.com/gpu" not in res.requests and "nvidia.com/gpu" not in res.limits
    assert pod.spec.node_selector == {"pool": "cpu"}


def test_checkpointing_gives_the_phase_its_checkpoint_prefix() -> None:
    on = phase_pod(attempt(checkpoint=True), namespace="ns", priority="weekly", kube=KUBE)
    off = phase_pod(attempt(checkpoint=False), namespace="ns", priority="weekly", kube=KUBE)
    assert (
        env_of(on)[contract.ENV_CHECKPOINT_URI]
        == "file:///art/runs/avsim_weekly__manual__1/checkpoints/case-00001/simulate"
    )
    assert env_of(off)[contract.ENV_CHECKPOINT_URI] == ""


def test_the_lease_is_named_after_the_pod_and_absent_without_one() -> None:
    leased = phase_pod(attempt(lease_seconds=120), namespace="phases", priority="weekly", kube=KUBE)
    env = env_of(leased)
    assert (
        env[contract.ENV_LEASE_NAME] == leased.metadata.name and env[contract.ENV_LEASE_NAMESPACE] == "phases"
    )
    assert leased.metadata.namespace == "phases"
    unleased = phase_pod(attempt(lease_seconds=0), namespace="phases", priority="weekly", kube=KUBE)
    assert contract.ENV_LEASE_NAME not in env_of(unleased)


def test_settings_decide_identity_sandbox_and_how_long() -> None:
    a = attempt(timeout_seconds=7777)
    pod = phase_pod(a, namespace="ns", priority="weekly", kube=KUBE)
    assert pod.spec.service_account_name == "sim-runner" and pod.spec.automount_service_account_token
    assert pod.spec.security_context.run_as_user == pod.spec.security_context.fs_group == 2000
    assert pod.spec.active_deadline_seconds == 7777 and pod.spec.restart_policy == "Never"
    assert pod.spec.termination_grace_period_seconds == 30
    assert pod.spec.enable_service_links is False and pod.spec.host_network is False
    shm = ["/dev/shm"] if a.runtime.pod.shm_size else []
    assert [m.mount_path for m in pod.spec.containers[0].volume_mounts] == [SCRATCH_MOUNT, *shm]
    other = phase_pod(a, namespace="ns", priority="weekly", kube=KUBE, service_account="x", grace_seconds=5)
    assert (other.spec.service_account_name, other.spec.termination_grace_period_seconds) == ("x", 5)
    assert env_of(pod) == env_of(other), "the environment does not depend on who sends the pod"


def test_the_pod_is_a_function_of_its_inputs() -> None:
    a = attempt()
    first = phase_pod(a, namespace="ns", priority="weekly", kube=KUBE).to_dict()
    assert phase_pod(a, namespace="ns", priority="weekly", kube=KUBE).to_dict() == first
    later = phase_pod(a.with_attempt(4), namespace="ns", priority="weekly", kube=KUBE)
    assert (
        later.metadata.name
        == pods.pod_name(a.layout.run_key, a.case_id, a.phase, 4)
        != first["metadata"]["name"]
    )
    assert env_of(later)[contract.ENV_ATTEMPT] == "4"
