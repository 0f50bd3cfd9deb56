"""The ``[avsim]`` configuration section, read in one place.

Defaults are declared once, in :data:`OPTIONS`; ``get_provider_info()`` publishes
them to Airflow's config, and :func:`load_settings` reads them back (environment
variables ``AIRFLOW__AVSIM__<KEY>`` override as for any Airflow option).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from avsim.errors import ConfigError

#: The phase backends this version ships.
BACKENDS = ("local", "kubernetes")
#: ``[avsim] admission``: by cases in flight (the default), or the window of whole shard runs.
ADMISSION_MODES = ("cases_in_flight", "window")

#: Where each node class's pods go by default: a node label and the taints those nodes carry.
DEFAULT_NODE_CLASSES = {
    "gpu-spot": {
        "node_selector": {"avsim.io/node-class": "gpu-spot"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "avsim.io/spot", "operator": "Exists", "effect": "NoSchedule"},
        ],
    },
    "gpu-on-demand": {
        "node_selector": {"avsim.io/node-class": "gpu-on-demand"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "cpu": {"node_selector": {"avsim.io/node-class": "cpu"}, "tolerations": []},
}
#: Kubernetes PriorityClass of each run class's pods: the weekly run's pods also win on the cluster.
DEFAULT_PRIORITY_CLASSES = {"canary": "avsim-canary", "weekly": "avsim-weekly", "adhoc": "avsim-adhoc"}

#: option -> (default, type, description)
OPTIONS: dict[str, tuple[str, str, str]] = {
    "backend": (
        "local",
        "string",
        "Where phases run: 'local' (a process on the worker, the embedded default) or 'kubernetes' "
        "(a pod per attempt, through the kubernetes_* options).",
    ),
    "artifact_root": (
        "",
        "string",
        "ObjectStoragePath URI under which runs keep artifacts, the ledger and reports "
        "(e.g. s3://aws_default@avsim-artifacts/avsim). Empty: file://$AIRFLOW_HOME/avsim/artifacts.",
    ),
    "graph_catalog": (
        "",
        "string",
        "Path of the graph catalog that shapes the weekly DAGs. Empty: avsim_graphs.yaml in the DAGs folder.",
    ),
    "default_manifest": (
        "",
        "string",
        "Manifest URI of the scheduled weekly run; '{iso_week}' is replaced by the run's ISO week.",
    ),
    "shard_size": (
        "250",
        "integer",
        "Most cases in one shard DAG run (S). Admitting by cases in flight, a week's shard runs hold a "
        "third of the target, at most this many.",
    ),
    "max_active_shards": ("6", "integer", "Most shard DAG runs active at once (W)."),
    "gpu_spot_pool": ("avsim_gpu_spot", "string", "Airflow pool of GPU phases on spot nodes."),
    "gpu_on_demand_pool": ("avsim_gpu_on_demand", "string", "Airflow pool of GPU phases on on-demand nodes."),
    "cpu_pool": ("avsim_cpu", "string", "Airflow pool of CPU phases."),
    "gpu_queue": (
        "",
        "string",
        "Executor queue of GPU phases (both GPU pools): with the CeleryExecutor, the Celery queue that only "
        "workers on GPU machines consume (docs/deployment.md, 'Queues and machines'). Empty: [operators] "
        "default_queue. Executors without queues (Local, Kubernetes) ignore it.",
    ),
    "cpu_queue": (
        "",
        "string",
        "Executor queue of CPU phases (the CPU pool); empty: [operators] default_queue.",
    ),
    "on_demand_fallback": (
        "True",
        "boolean",
        "GPU phases preempted on_demand_after_preemptions times on spot nodes move to on-demand nodes "
        "(their twin task <phase>_on_demand in the on-demand pool).",
    ),
    "reuse_outputs": (
        "True",
        "boolean",
        "A phase whose cache key (build digest, phase spec, inputs, seed) matches a committed result "
        "reuses it instead of launching (cheap reruns).",
    ),
    "kubernetes_conn_id": (
        "kubernetes_default",
        "string",
        "Airflow connection of the cluster phases run on.",
    ),
    "kubernetes_namespace": ("avsim", "string", "Namespace of the phase pods and their Leases."),
    "kubernetes_service_account": (
        "avsim-phase",
        "string",
        "Service account of phase pods (it needs only 'patch' on coordination.k8s.io leases).",
    ),
    "kubernetes_node_classes": (
        json.dumps(DEFAULT_NODE_CLASSES),
        "string",
        "JSON: node class (gpu-spot, gpu-on-demand, cpu) -> {node_selector, tolerations} of its pods.",
    ),
    "kubernetes_priority_classes": (
        json.dumps(DEFAULT_PRIORITY_CLASSES),
        "string",
        "JSON: run class (canary, weekly, adhoc) -> Kubernetes PriorityClass of its pods ('' for none).",
    ),
    "kubernetes_deferrable": (
        "True",
        "boolean",
        "Wait for pods in the triggerer (one shared watch per namespace).",
    ),
    "kubernetes_startup_timeout_seconds": (
        "3600",
        "integer",
        "How long a pod may stay Pending (waiting for a node) before the attempt is an infrastructure failure.",
    ),
    "kubernetes_run_as_user": ("1000", "integer", "UID phase containers run as (never root)."),
    "shard_poll_seconds": ("10", "float", "How often the parent run checks its shard runs."),
    "airflow_api_conn_id": (
        "avsim_airflow_api",
        "string",
        "Airflow connection of the Airflow REST API (type avsim_airflow_api: the API server's URL, and a "
        "login and password or extra.token) through which a cleared `shards` task clears its failed shard "
        "run's failed task instances: the repair in place (docs/operations.md, runbook 2).",
    ),
    "max_manifest_bytes": ("67108864", "integer", "Largest manifest accepted, in bytes."),
    # capacity planner: the orchestrator's cost per phase (issue 14, item 5)
    "planner_phase_overhead_seconds": (
        "0",
        "float",
        "Seconds 'avsim plan' adds to every phase attempt besides its work: from the upstream phase's end "
        "to the phase's process starting, plus the fixed cost around its work (bench/planner_forecast.py "
        "measures it; docs/performance.md). 0 keeps production forecasts of long phases as they were.",
    ),
    # manifest safety (issue 16)
    "max_manifest_cases": (
        "100000",
        "integer",
        "Most cases in one manifest: validate refuses more and 'avsim manifest sample' writes no more.",
    ),
    "manifest_uri_schemes": (
        "s3",
        "string",
        "Comma-separated URI schemes a manifest's URIs (scenario.uri) may use, besides the artifact "
        "store's own scheme.",
    ),
    "manifest_uri_prefixes": (
        "",
        "string",
        "Comma-separated URI prefixes (s3://bucket/, file:///data/scenarios/). Set: every URI of a "
        "manifest starts with one of them (or the artifact root). file:// URIs are always confined to "
        "these and the artifact root.",
    ),
    "manifest_allow_past_deadline": (
        "False",
        "boolean",
        "Let prepare start a run whose deadline has already passed (replaying a past week).",
    ),
    "deadline_interval_seconds": (
        "300",
        "float",
        "How often the deadline tracker re-estimates the run's finish.",
    ),
    "deadline_default_hours": (
        "156",
        "float",
        "The Deadline Alert's deadline of a run whose conf gives no 'deadline': this many hours after "
        "the run's run_after (156: Monday 06:00 to Sunday 18:00).",
    ),
    "deadline_api_conn_id": (
        "",
        "string",
        "Airflow connection of the Airflow REST API (host, login, password) the tracker raises the GPU "
        "spot pool through. Empty: never change pools.",
    ),
    "deadline_max_gpu_slots": (
        "0",
        "integer",
        "Most slots the tracker may give the GPU spot pool (0: never raise).",
    ),
    "deadline_aws_conn_id": (
        "aws_default",
        "string",
        "AWS connection of the EKS cluster the tracker scales.",
    ),
    "deadline_eks_cluster": (
        "",
        "string",
        "EKS cluster of the GPU spot node group. Empty: never scale nodes.",
    ),
    "deadline_eks_nodegroup": ("", "string", "EKS managed node group of the GPU spot nodes."),
    "deadline_eks_max_nodes": (
        "0",
        "integer",
        "Largest desired size the tracker may give the node group (0: never).",
    ),
    "deadline_gpus_per_node": ("1", "integer", "GPUs per node of that node group."),
    # admission by cases in flight (issue 29)
    "admission": (
        "cases_in_flight",
        "string",
        "How a week starts its shard runs. cases_in_flight: each as soon as fewer cases than the target "
        "are unfinished, so the week never drops below it while cases wait (cases_in_flight; "
        "docs/design.md, 'Admission by cases in flight'). window: whole shard runs of shard_size, "
        "max_active_shards at once, a new one when one ends.",
    ),
    "cases_in_flight": (
        "0",
        "integer",
        "Unfinished cases a week keeps in flight. 0: derived from the pools (avsim.plan.inflight: "
        "Little's law over the binding pool, times a measured headroom; docs/design.md).",
    ),
    "scheduler_ms_per_task_instance": (
        "3",
        "float",
        "Milliseconds the scheduler's loop pays per unfinished task instance of the active runs: "
        "3 is this project's 2-core test machine (docs/performance.md); measure a production "
        "scheduler's (StatsD scheduler.scheduler_loop_duration / unfinished task instances). "
        "'avsim plan' and the planner use it for the loop time and its delay.",
    ),
    # triage of newly failing cases
    "triage_gpu_share": (
        "0.02",
        "float",
        "Most share of the week's GPU-seconds that triage's reruns of newly failing cases may use "
        "(0.02: 2 %); cases that do not fit are listed as not triaged. 0 turns triage off.",
    ),
    "triage_reruns": (
        "2",
        "integer",
        "Reruns of a newly failing case's failing phase (and its downstream) on each build, this "
        "week's and last week's.",
    ),
    "triage_confirm_passing": (
        "False",
        "boolean",
        "Rerun each newly passing case once on this week's build, with the same seed, to confirm the "
        "pass (within triage's GPU share).",
    ),
    "determinism_sample": (
        "0.005",
        "float",
        "Share of the week's passed cases the determinism audit reruns on the same build and seed "
        "(at least 5 cases); 0 turns the audit off.",
    ),
}


@dataclass(frozen=True)
class KubernetesSettings:
    conn_id: str = "kubernetes_default"
    namespace: str = "avsim"
    service_account: str = "avsim-phase"
    node_classes: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_NODE_CLASSES))
    priority_classes: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PRIORITY_CLASSES))
    deferrable: bool = True
    startup_timeout_seconds: int = 3600
    run_as_user: int = 1000

    def __post_init__(self) -> None:
        missing = {"gpu-spot", "gpu-on-demand", "cpu"} - set(self.node_classes)
        if missing:
            raise ConfigError(
                f"[avsim] kubernetes_node_classes has no entry for {sorted(missing)}; give each node class "
                "its node_selector and tolerations"
            )
        for name, spec in self.node_classes.items():
            if not isinstance(spec, dict) or set(spec) - {"node_selector", "tolerations"}:
                raise ConfigError(
                    f"[avsim] kubernetes_node_classes[{name!r}] must be an object with node_selector and "
                    "tolerations only"
                )
        if self.run_as_user <= 0:
            raise ConfigError("[avsim] kubernetes_run_as_user must be a non-root UID (> 0)")


@dataclass(frozen=True)
class DeadlineSettings:
    """``[avsim] deadline_*``: the Deadline Alert and the deadline tracker (estimating always; acting off)."""

    interval_seconds: float = 300.0
    default_hours: float = 156.0
    api_conn_id: str = ""
    max_gpu_slots: int = 0
    aws_conn_id: str = "aws_default"
    eks_cluster: str = ""
    eks_nodegroup: str = ""
    eks_max_nodes: int = 0
    gpus_per_node: int = 1

    def __post_init__(self) -> None:
        if not 5 <= self.interval_seconds <= 86_400:
            raise ConfigError(f"[avsim] deadline_interval_seconds = {self.interval_seconds}; use 5..86400")
        if self.default_hours <= 0:
            raise ConfigError(f"[avsim] deadline_default_hours = {self.default_hours}; use a positive number")
        if self.max_gpu_slots < 0 or self.eks_max_nodes < 0 or self.gpus_per_node < 1:
            raise ConfigError(
                "[avsim] deadline_max_gpu_slots and deadline_eks_max_nodes must be >= 0 and "
                "deadline_gpus_per_node >= 1"
            )
        if bool(self.eks_cluster) != bool(self.eks_nodegroup):
            raise ConfigError("[avsim] set both deadline_eks_cluster and deadline_eks_nodegroup, or neither")


# manifest safety (issue 16)
@dataclass(frozen=True)
class ManifestSafetySettings:
    """``[avsim] max_manifest_cases, manifest_uri_*, manifest_allow_past_deadline``."""

    max_cases: int = 100_000
    uri_schemes: tuple[str, ...] = ("s3",)
    uri_prefixes: tuple[str, ...] = ()
    allow_past_deadline: bool = False

    def __post_init__(self) -> None:
        if self.max_cases < 1:
            raise ConfigError(f"[avsim] max_manifest_cases = {self.max_cases}; use a positive number")
        for scheme in self.uri_schemes:
            if not scheme.isascii() or not scheme.isalnum() or scheme != scheme.lower():
                raise ConfigError(f"[avsim] manifest_uri_schemes has {scheme!r}; write schemes like 's3'")
        for prefix in self.uri_prefixes:
            if "://" not in prefix:
                raise ConfigError(
                    f"[avsim] manifest_uri_prefixes has {prefix!r}; write URIs like s3://bucket/"
                )


@dataclass(frozen=True)
class TriageSettings:
    """``[avsim] triage_gpu_share``, ``triage_reruns``, ``determinism_sample``, ``triage_confirm_passing``."""

    gpu_share: float = 0.02
    reruns: int = 2
    determinism_sample: float = 0.005
    confirm_passing: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_share <= 1:
            raise ConfigError(
                f"[avsim] triage_gpu_share = {self.gpu_share}; use a share in [0, 1], e.g. 0.02"
            )
        if not 1 <= self.reruns <= 10:
            raise ConfigError(f"[avsim] triage_reruns = {self.reruns}; use 1..10")
        if not 0 <= self.determinism_sample <= 1:
            raise ConfigError(
                f"[avsim] determinism_sample = {self.determinism_sample}; use a share in [0, 1], e.g. 0.005"
            )


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class AvsimSettings:
    backend: str = "local"
    artifact_root: str = ""
    graph_catalog: str = ""
    default_manifest: str = ""
    shard_size: int = 250
    max_active_shards: int = 6
    gpu_spot_pool: str = "avsim_gpu_spot"
    gpu_on_demand_pool: str = "avsim_gpu_on_demand"
    cpu_pool: str = "avsim_cpu"
    gpu_queue: str = ""
    cpu_queue: str = ""
    on_demand_fallback: bool = True
    reuse_outputs: bool = True
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    shard_poll_seconds: float = 10.0
    airflow_api_conn_id: str = "avsim_airflow_api"
    max_manifest_bytes: int = 64 * 2**20
    deadline: DeadlineSettings = field(default_factory=DeadlineSettings)
    manifest_safety: ManifestSafetySettings = field(default_factory=ManifestSafetySettings)
    cases_in_flight: int = 0
    scheduler_ms_per_task_instance: float = 3.0
    admission: str = "cases_in_flight"
    triage: TriageSettings = field(default_factory=TriageSettings)

    def __post_init__(self) -> None:
        if self.admission not in ADMISSION_MODES:
            raise ConfigError(
                f"[avsim] admission = {self.admission!r}; use one of: {', '.join(ADMISSION_MODES)}"
            )
        if self.cases_in_flight < 0:
            raise ConfigError(
                f"[avsim] cases_in_flight = {self.cases_in_flight}; use 0 (derive from the pools) or more"
            )
        if not 0 <= self.scheduler_ms_per_task_instance <= 10_000:
            raise ConfigError(
                f"[avsim] scheduler_ms_per_task_instance = {self.scheduler_ms_per_task_instance}; "
                "use milliseconds in [0, 10000]"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(f"[avsim] backend = {self.backend!r}; use one of: {', '.join(BACKENDS)}")
        if not 1 <= self.shard_size <= 100_000:
            raise ConfigError(f"[avsim] shard_size = {self.shard_size}; use 1..100000")
        if not 1 <= self.max_active_shards <= 1_000:
            raise ConfigError(f"[avsim] max_active_shards = {self.max_active_shards}; use 1..1000")

    @property
    def resolved_artifact_root(self) -> str:
        if self.artifact_root:
            return self.artifact_root
        home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
        return f"file://{Path(home).resolve()}/avsim/artifacts"

    def resolved_graph_catalog(self, dags_folder: str | None = None) -> str:
        if self.graph_catalog:
            return self.graph_catalog
        folder = (
            dags_folder
            or os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
            or str(Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow") / "dags")
        )
        return str(Path(folder) / "avsim_graphs.yaml")


def _json_object(key: str, value: str) -> dict[str, Any]:
    try:
        doc = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"[avsim] {key} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"[avsim] {key} must be a JSON object")
    return doc


def _boolean(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (use True or False)")


def airflow_config(section: str, key: str, fallback: str) -> str:
    """The one way avsim reads Airflow's configuration (``airflow.cfg`` and ``AIRFLOW__S__K``).

    The task SDK's parser: it reads the same files and environment as the core one and is there in
    every Airflow 3 process, task-SDK-only workers included (the core package may be absent).
    """
    from airflow.sdk.configuration import conf

    return str(conf.get(section, key, fallback=fallback))


def _kubernetes(get: Callable[[str], str]) -> KubernetesSettings:
    return KubernetesSettings(
        conn_id=get("kubernetes_conn_id"),
        namespace=get("kubernetes_namespace"),
        service_account=get("kubernetes_service_account"),
        node_classes=_json_object("kubernetes_node_classes", get("kubernetes_node_classes")),
        priority_classes=_json_object("kubernetes_priority_classes", get("kubernetes_priority_classes")),
        deferrable=_boolean(get("kubernetes_deferrable")),
        startup_timeout_seconds=int(get("kubernetes_startup_timeout_seconds")),
        run_as_user=int(get("kubernetes_run_as_user")),
    )


def _deadline(get: Callable[[str], str]) -> DeadlineSettings:
    return DeadlineSettings(
        interval_seconds=float(get("deadline_interval_seconds")),
        default_hours=float(get("deadline_default_hours")),
        api_conn_id=get("deadline_api_conn_id"),
        max_gpu_slots=int(get("deadline_max_gpu_slots")),
        aws_conn_id=get("deadline_aws_conn_id"),
        eks_cluster=get("deadline_eks_cluster"),
        eks_nodegroup=get("deadline_eks_nodegroup"),
        eks_max_nodes=int(get("deadline_eks_max_nodes")),
        gpus_per_node=int(get("deadline_gpus_per_node")),
    )


def load_settings() -> AvsimSettings:
    """Read ``[avsim]`` from Airflow's configuration (and its environment overrides)."""

    def get(key: str) -> str:
        return airflow_config("avsim", key, OPTIONS[key][0])

    try:
        return AvsimSettings(
            backend=get("backend"),
            artifact_root=get("artifact_root"),
            graph_catalog=get("graph_catalog"),
            default_manifest=get("default_manifest"),
            shard_size=int(get("shard_size")),
            max_active_shards=int(get("max_active_shards")),
            gpu_spot_pool=get("gpu_spot_pool"),
            gpu_on_demand_pool=get("gpu_on_demand_pool"),
            cpu_pool=get("cpu_pool"),
            gpu_queue=get("gpu_queue"),
            cpu_queue=get("cpu_queue"),
            on_demand_fallback=_boolean(get("on_demand_fallback")),
            reuse_outputs=_boolean(get("reuse_outputs")),
            kubernetes=_kubernetes(get),
            shard_poll_seconds=float(get("shard_poll_seconds")),
            airflow_api_conn_id=get("airflow_api_conn_id"),
            max_manifest_bytes=int(get("max_manifest_bytes")),
            deadline=_deadline(get),
            manifest_safety=ManifestSafetySettings(
                max_cases=int(get("max_manifest_cases")),
                uri_schemes=_csv(get("manifest_uri_schemes")),
                uri_prefixes=_csv(get("manifest_uri_prefixes")),
                allow_past_deadline=_boolean(get("manifest_allow_past_deadline")),
            ),
            cases_in_flight=int(get("cases_in_flight")),
            scheduler_ms_per_task_instance=float(get("scheduler_ms_per_task_instance")),
            admission=get("admission").strip(),
            triage=TriageSettings(
                gpu_share=float(get("triage_gpu_share")),
                reruns=int(get("triage_reruns")),
                determinism_sample=float(get("determinism_sample")),
                confirm_passing=_boolean(get("triage_confirm_passing")),
            ),
        )
    except ValueError as exc:
        raise ConfigError(f"[avsim] has a value of the wrong type: {exc}") from exc
