"""The phase pod is hardened whatever a manifest asks: every allow-listed pod field at its boldest.

:func:`avsim.kube.pod_spec.phase_pod` builds the V1Pod of a realistic attempt (a GPU phase on spot
nodes, attempt 2, from a validated manifest whose phase sets every field ``PodOverrides`` allows,
with keys that collide with the names avsim and the stock operator use); the operator's seam
(``KubernetesPhaseOperator.attempt_pod``, what ``build_pod_request_obj`` sends) adds the task
instance's identifying labels, which the manifest's cannot replace either.

Hand-built here, in place of what a running task has: the :class:`PhaseAttempt` (the operator's
``begin_attempt`` builds it from the run's manifest snapshot and the ledger's claimed attempt
number; here it comes from the same validated phase spec, through the same
``PhaseRuntime.from_spec``) and the task-instance context (a namespace with the fields the stock
operator reads for its pod labels). No Kubernetes API is involved: ``dry_run`` builds the pod only.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import models as k8s
from pydantic import ValidationError

from avsim.artifacts import RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.contracts.case import CaseEntry
from avsim.errors import ManifestError
from avsim.kube import pods
from avsim.kube.pod_spec import SCRATCH_MOUNT, phase_pod
from avsim.manifest.models import FORBIDDEN_POD_FIELDS, SANDBOX_KEY_PREFIXES, Manifest
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.operators.kubernetes import KubernetesPhaseOperator
from avsim.phases import contract
from avsim.phases.contract import NODE_SPOT
from avsim.settings import KubernetesSettings

KUBE = KubernetesSettings(run_as_user=4242)
#: Everything PodOverrides allows, pushed as far as validation lets it go.
BOLDEST_POD: dict[str, Any] = {
    "labels": {
        "team": "simulation",
        # The stock operator's identifying labels and avsim's own selector labels' neighbours.
        "dag_id": "someone_else",
        "task_id": "other.task",
        "run_id": "other_run",
        "try_number": "99",
        "map_index": "7",
        "kubernetes_pod_operator": "False",
        "airflow_version": "1.0",
        "app.kubernetes.io/name": "simulator",
    },
    "annotations": {"example.com/owner": "team-sim", "avsim-build": "forged"},
    "env": {"LD_LIBRARY_PATH": "/opt/sim/lib", "PYTHONUNBUFFERED": "0", "HOME": "/root", "USER": "root"},
    "ephemeral_storage": "200Gi",
    "shm_size": "64Gi",
}


def _manifest(pod: dict[str, Any]) -> Manifest:
    doc = sample_manifest(2, iso_week="2026-W49")
    doc["graphs"]["standard"]["phases"]["simulate"]["pod"] = copy.deepcopy(pod)
    return validate_manifest(doc)


RUN = {
    "run_key": "avsim_weekly__scheduled__2026-11-30T06_00_00_00_00",
    "artifact_root": "s3://avsim_s3@avsim-artifacts/avsim",
    "run_class": "weekly",
}


def _attempt(pod_overrides: dict[str, Any] = BOLDEST_POD) -> PhaseAttempt:
    """What begin_attempt returns for attempt 2 of a spot GPU phase (see the module docstring)."""
    m = _manifest(pod_overrides)
    spec = m.graphs["standard"].phases["simulate"].model_dump(mode="json", by_alias=True)
    case = m.cases[0]
    return PhaseAttempt(
        layout=RunLayout(RUN["artifact_root"], RUN["run_key"]),
        case=CaseEntry(case_id=case.id, seed=case.seed, parameters=case.parameters),
        phase="simulate",
        attempt=2,
        runtime=PhaseRuntime.from_spec(spec),
        build_id=m.run.build.build_id,
        image=m.run.build.image,
        inputs={"prepare": "s3://avsim_s3@avsim-artifacts/avsim/runs/x/cases/c/prepare/attempt-1"},
        node_class=NODE_SPOT,
    )


def _pod(pod_overrides: dict[str, Any] = BOLDEST_POD) -> tuple[k8s.V1Pod, PhaseAttempt]:
    attempt = _attempt(pod_overrides)
    return phase_pod(attempt, namespace="avsim", priority="weekly", kube=KUBE), attempt


def _walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, node)]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_walk(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_walk(v, f"{path}[{i}]"))
    return out


def test_no_setting_anywhere_in_the_pod_grants_host_access_privilege_or_root() -> None:
    pod, _ = _pod()
    found = _walk(pod.to_dict())
    for path, value in found:
        leaf = path.rsplit(".", 1)[-1]
        if leaf in {"privileged", "allow_privilege_escalation", "host_network", "host_pid", "host_ipc"}:
            assert not value, f"{path} = {value!r}"
        if leaf in {"host_path", "host_users", "proc_mount", "share_process_namespace", "node_name"}:
            assert value is None, f"{path} = {value!r}"
        if leaf in {"run_as_user", "run_as_group"}:
            assert value is None or value > 0, f"{path} = {value!r}"
        if leaf == "run_as_non_root":
            assert value is True, path
        if path.endswith("capabilities.add"):
            assert not value, f"{path} = {value!r}"
    assert any(path.endswith(".run_as_non_root") for path, _ in found)


def test_the_pod_is_non_root_read_only_capability_free_and_seccomp_confined() -> None:
    pod, attempt = _pod()
    spec = pod.spec
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.run_as_user == spec.security_context.run_as_group == KUBE.run_as_user
    assert spec.security_context.fs_group == KUBE.run_as_user
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    assert [c.name for c in spec.containers] == [pods.CONTAINER] and not spec.init_containers
    [base] = spec.containers
    sc = base.security_context
    assert (sc.privileged, sc.allow_privilege_escalation, sc.read_only_root_filesystem) == (
        False,
        False,
        True,
    )
    assert sc.capabilities.drop == ["ALL"] and not sc.capabilities.add
    assert sc.run_as_non_root is True
    # What runs is the run's build, pinned by digest, with the phase's command: not the manifest's pod.
    assert base.image == attempt.image and "@sha256:" in base.image
    assert [*base.command, *base.args] == attempt.argv
    assert spec.restart_policy == "Never" and spec.active_deadline_seconds == int(
        attempt.runtime.timeout_seconds
    )


def test_volumes_are_the_scratch_dir_and_shm_only() -> None:
    pod, _ = _pod()
    volumes = {v.name: v for v in pod.spec.volumes}
    assert set(volumes) == {"scratch", "dshm"}
    assert volumes["scratch"].empty_dir.size_limit == "200Gi" and volumes["scratch"].empty_dir.medium is None
    assert volumes["dshm"].empty_dir.medium == "Memory" and volumes["dshm"].empty_dir.size_limit == "64Gi"
    for v in volumes.values():
        assert {k for k, val in v.to_dict().items() if val is not None} == {"name", "empty_dir"}
    mounts = {m.mount_path: m.name for m in pod.spec.containers[0].volume_mounts}
    assert mounts == {SCRATCH_MOUNT: "scratch", "/dev/shm": "dshm"}


def test_placement_identity_and_resources_come_from_avsim_not_from_the_manifest() -> None:
    pod, attempt = _pod()
    spec = pod.spec
    placement = KUBE.node_classes["gpu-spot"]
    assert spec.node_selector == placement["node_selector"]
    assert [t.to_dict() for t in spec.tolerations] == [
        k8s.V1Toleration(**t).to_dict() for t in placement["tolerations"]
    ]
    assert spec.service_account_name == KUBE.service_account
    assert spec.priority_class_name == KUBE.priority_classes["weekly"]
    assert not spec.image_pull_secrets and not spec.host_aliases and not spec.runtime_class_name
    res = spec.containers[0].resources
    assert res.requests["nvidia.com/gpu"] == res.limits["nvidia.com/gpu"] == "1"
    assert res.limits["memory"] == attempt.runtime.memory and res.limits["ephemeral-storage"] == "200Gi"


def test_labels_annotations_and_env_from_the_manifest_never_replace_avsims() -> None:
    pod, attempt = _pod()
    labels = pod.metadata.labels
    expected = pods.attempt_labels(attempt.layout.run_key, attempt.case_id, "simulate", 2, "gpu-spot")
    assert {k: labels[k] for k in expected} == expected
    assert labels["team"] == "simulation" and labels["app.kubernetes.io/name"] == "simulator"
    assert pod.metadata.name == pods.pod_name(attempt.layout.run_key, attempt.case_id, "simulate", 2)
    assert pod.metadata.annotations == {
        "example.com/owner": "team-sim",
        "avsim-build": "forged",
        "avsim.io/build": attempt.build_id,
    }
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert len(env) == len(pod.spec.containers[0].env), "a variable is set twice"
    contract_env = attempt.environment()
    assert {k: env[k] for k in contract_env} == contract_env
    assert env["PYTHONUNBUFFERED"] == "1" and env[contract.ENV_LEASE_NAME] == pod.metadata.name
    assert env["LD_LIBRARY_PATH"] == "/opt/sim/lib"
    assert not any(e.value_from for e in pod.spec.containers[0].env), "no variable reads a Secret"
    assert not pod.spec.containers[0].env_from


def test_the_operator_sends_that_pod_with_the_task_instances_identifying_labels() -> None:
    """The seam: the stock operator's labels are the task instance's, whatever the manifest wrote;
    everything else is the pod :func:`phase_pod` built."""
    attempt = _attempt()
    op = KubernetesPhaseOperator(
        task_id="standard.simulate", phase="simulate", case={"case_id": "c1"}, run=RUN, gpus=1, kube=KUBE
    )
    ti = SimpleNamespace(dag_id="avsim_weekly_shard", task_id="standard.simulate", map_index=3, try_number=2)
    context = {"ti": ti, "run_id": "scheduled__2026-11-30__shard_0001", "dag": SimpleNamespace()}
    sent = op.attempt_pod(attempt, context, dry_run=True)
    labels = sent.metadata.labels
    assert (labels["dag_id"], labels["task_id"], labels["try_number"], labels["map_index"]) == (
        "avsim_weekly_shard",
        "standard.simulate",
        "2",
        "3",
    )
    assert labels["run_id"] != "other_run" and labels["kubernetes_pod_operator"] == "True"
    assert labels["airflow_version"] != "1.0"
    built, _ = _pod()
    stock = {"dag_id", "task_id", "run_id", "try_number", "map_index", "kubernetes_pod_operator"}
    stock.add("airflow_version")
    assert {k: v for k, v in labels.items() if k not in stock} == {
        k: v for k, v in built.metadata.labels.items() if k not in stock
    }
    sent.metadata.labels = built.metadata.labels
    assert sent.to_dict() == built.to_dict()
    # The canary's shard run gets the canary's PriorityClass, any other run its run class's.
    canary = op.attempt_pod(attempt, {**context, "run_id": "scheduled__2026-11-30__canary"}, dry_run=True)
    assert canary.spec.priority_class_name == KUBE.priority_classes["canary"]
    assert sent.spec.priority_class_name == KUBE.priority_classes["weekly"]


@pytest.mark.parametrize("field", sorted(FORBIDDEN_POD_FIELDS))
def test_a_forbidden_pod_field_never_reaches_the_operator(field: str) -> None:
    """Refused by validation; and by ``PhaseRuntime.from_spec`` too, should a run's snapshot be edited
    in the artifact store after validation."""
    with pytest.raises(ManifestError) as exc:
        _manifest({**BOLDEST_POD, field: True})
    assert [p.path for p in exc.value.problems] == [f"graphs.standard.phases.simulate.pod.{field}"]
    spec = _manifest(BOLDEST_POD).graphs["standard"].phases["simulate"].model_dump(mode="json", by_alias=True)
    spec["pod"][field] = True
    with pytest.raises(ValidationError, match=f"pod field '{field}' is not allowed"):
        PhaseRuntime.from_spec(spec)


@pytest.mark.parametrize("prefix", SANDBOX_KEY_PREFIXES)
@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_keys_that_change_the_sandbox_credentials_or_network_are_refused(prefix: str, where: str) -> None:
    key = prefix + ("base" if prefix.endswith("/") else "Devices")
    pod = {**BOLDEST_POD, where: {key: "unconfined"}}
    with pytest.raises(ManifestError) as exc:
        _manifest(pod)
    [problem] = exc.value.problems
    assert problem.path == f"graphs.standard.phases.simulate.pod.{where}"
    assert f"{where} key {key!r} would change the pod's sandbox" in problem.message
