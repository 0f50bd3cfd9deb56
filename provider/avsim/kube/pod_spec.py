"""The pod of a phase attempt, built as data: a pure function of the attempt and the cluster settings.

:func:`phase_pod` is the whole hardened spec (what runs, where, the sandbox, how long: its
docstring), and nothing else writes one. :class:`avsim.operators.kubernetes.KubernetesPhaseOperator`
sends it, adding only what the stock operator adds to every pod (the task instance's identifying
labels, Airflow's version) and the cluster's ``pod_mutation_hook``.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import models as k8s

from avsim.artifacts import is_canary_run, is_triage_run
from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.kube import pods
from avsim.manifest.models import RunClass
from avsim.phases import contract
from avsim.settings import KubernetesSettings

#: Where the writable scratch directory is mounted (the root file system is read-only).
SCRATCH_MOUNT = "/tmp"
SHM_MOUNT = "/dev/shm"
#: The stock operator's default, which avsim keeps: seconds between SIGTERM and SIGKILL.
DEFAULT_GRACE_SECONDS = 30
#: The key of ``[avsim] kubernetes_priority_classes`` for a canary shard run.
CANARY_PRIORITY = "canary"
#: ... and for a triage shard run: the ad-hoc class (triage ranks below every week).
TRIAGE_PRIORITY = "adhoc"


def priority_key(run_class: RunClass, run_id: str) -> str:
    """Which PriorityClass a run's pods get: the canary's for the canary's shard run, the ad-hoc class for
    a triage shard run (it ranks below the weeks), else the run class's."""
    if is_triage_run(run_id):
        return TRIAGE_PRIORITY
    return CANARY_PRIORITY if is_canary_run(run_id) else run_class


def environment(attempt: PhaseAttempt, *, name: str, namespace: str) -> list[k8s.V1EnvVar]:
    """The container's environment, sorted: the manifest's extras, then the contract's over them."""
    env = {**attempt.runtime.pod.env, **attempt.environment(), "PYTHONUNBUFFERED": "1"}
    if attempt.runtime.lease_seconds:
        env[contract.ENV_LEASE_NAME] = name
        env[contract.ENV_LEASE_NAMESPACE] = namespace
    return [k8s.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())]


def resources(runtime: PhaseRuntime) -> k8s.V1ResourceRequirements:
    """Requests and limits: the phase's CPUs and memory, its GPUs and scratch space as both."""
    requests: dict[str, str] = {"cpu": f"{runtime.cpus:g}", "memory": runtime.memory}
    limits: dict[str, str] = {"memory": runtime.memory}
    if runtime.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(runtime.gpus)
    if runtime.pod.ephemeral_storage:
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = runtime.pod.ephemeral_storage
    return k8s.V1ResourceRequirements(requests=requests, limits=limits)


def pod_security(run_as_user: int) -> k8s.V1PodSecurityContext:
    return k8s.V1PodSecurityContext(
        run_as_non_root=True,
        run_as_user=run_as_user,
        run_as_group=run_as_user,
        fs_group=run_as_user,
        seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
        app_armor_profile=k8s.V1AppArmorProfile(type="RuntimeDefault"),
    )


def container_security() -> k8s.V1SecurityContext:
    return k8s.V1SecurityContext(
        run_as_non_root=True,
        allow_privilege_escalation=False,
        privileged=False,
        read_only_root_filesystem=True,
        capabilities=k8s.V1Capabilities(drop=["ALL"]),
    )


def volumes(runtime: PhaseRuntime) -> tuple[list[k8s.V1Volume], list[k8s.V1VolumeMount]]:
    """The scratch directory, and ``/dev/shm`` in memory when the manifest sizes it: nothing else."""
    overrides = runtime.pod
    vols = [
        k8s.V1Volume(
            name="scratch", empty_dir=k8s.V1EmptyDirVolumeSource(size_limit=overrides.ephemeral_storage)
        )
    ]
    mounts = [k8s.V1VolumeMount(name="scratch", mount_path=SCRATCH_MOUNT)]
    if overrides.shm_size:
        vols.append(
            k8s.V1Volume(
                name="dshm",
                empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=overrides.shm_size),
            )
        )
        mounts.append(k8s.V1VolumeMount(name="dshm", mount_path=SHM_MOUNT))
    return vols, mounts


def phase_pod(
    attempt: PhaseAttempt,
    *,
    namespace: str,
    priority: str,
    kube: KubernetesSettings,
    service_account: str | None = None,
    grace_seconds: int | None = DEFAULT_GRACE_SECONDS,
) -> k8s.V1Pod:
    """The pod of one attempt (its name is :func:`avsim.kube.pods.pod_name` of the attempt).

    ``attempt`` carries the phase's runtime (command, resources, timeout, lease, checkpointing,
    the manifest's pod extras), the contract's environment and the node class it runs on (a GPU
    phase's on-demand twin runs on ``gpu-on-demand``); ``priority`` is a key of
    ``kube.priority_classes`` (:func:`priority_key`); ``service_account`` defaults to
    ``kube.service_account``.

    - **what runs**: the run's build, pinned by digest, with the phase's command and arguments (never
      the manifest's pod), the phase contract's environment (:meth:`PhaseAttempt.environment`), the
      Lease to renew when the phase has one, and the manifest's allow-listed extras underneath
      (:class:`avsim.manifest.models.PodOverrides`: labels, annotations, environment, scratch and
      ``/dev/shm`` sizes), which never replace avsim's own;
    - **where**: the node class's node selector and tolerations (``[avsim] kubernetes_node_classes``;
      a GPU phase's on-demand twin is the ``gpu-on-demand`` class), the run class's PriorityClass
      (the canary's shard run has its own, :func:`priority_key`), requests and limits with
      ``nvidia.com/gpu`` for GPU phases;
    - **the sandbox**: non-root (``[avsim] kubernetes_run_as_user``), seccomp and AppArmor
      ``RuntimeDefault``, no privilege escalation, every capability dropped, a read-only root with an
      ``emptyDir`` scratch at ``/tmp`` (and ``/dev/shm`` in memory when asked), no host network, no
      Service links, the phase's service account (it renews its Lease with it);
    - **how long**: ``activeDeadlineSeconds`` is the phase's timeout, ``restartPolicy`` is ``Never``
      (a retry is a new attempt with a new pod).
    """
    runtime, overrides = attempt.runtime, attempt.runtime.pod
    name = pods.pod_name(attempt.layout.run_key, attempt.case_id, attempt.phase, attempt.attempt)
    placement: dict[str, Any] = kube.node_classes.get(attempt.node_class, {})
    vols, mounts = volumes(runtime)
    container = k8s.V1Container(
        name=pods.CONTAINER,
        image=attempt.image,
        command=list(runtime.command),
        args=list(runtime.args),
        env=environment(attempt, name=name, namespace=namespace),
        env_from=[],
        ports=[],
        resources=resources(runtime),
        volume_mounts=mounts,
        security_context=container_security(),
        termination_message_policy="File",
    )
    labels = {
        **overrides.labels,
        **pods.attempt_labels(
            attempt.layout.run_key, attempt.case_id, attempt.phase, attempt.attempt, attempt.node_class
        ),
    }
    return k8s.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=k8s.V1ObjectMeta(
            name=name,
            namespace=namespace,
            labels=labels,
            annotations={**overrides.annotations, "avsim.io/build": attempt.build_id},
        ),
        spec=k8s.V1PodSpec(
            containers=[container],
            init_containers=[],
            image_pull_secrets=[],
            affinity=k8s.V1Affinity(),  # none: the node class's selector and tolerations place the pod
            node_selector=dict(placement.get("node_selector") or {}),
            tolerations=[k8s.V1Toleration(**t) for t in placement.get("tolerations") or []],
            priority_class_name=kube.priority_classes.get(priority) or None,
            service_account_name=service_account or kube.service_account,
            automount_service_account_token=True,  # the phase renews its Lease with it
            enable_service_links=False,  # no variables for every Service in the namespace: none needed
            host_network=False,
            security_context=pod_security(kube.run_as_user),
            volumes=vols,
            restart_policy="Never",
            active_deadline_seconds=int(runtime.timeout_seconds),
            termination_grace_period_seconds=grace_seconds,
        ),
    )
