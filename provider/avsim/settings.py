"""The ``[avsim]`` configuration section, read in one place.

Defaults are declared once, in :data:`OPTIONS`; ``get_provider_info()`` publishes
them to Airflow's config, and :func:`load_settings` reads them back (environment
variables ``AIRFLOW__AVSIM__<KEY>`` override as for any Airflow option).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from avsim.errors import ConfigError

#: The phase backends this version ships.
BACKENDS = ("local",)

#: option -> (default, type, description)
OPTIONS: dict[str, tuple[str, str, str]] = {
    "backend": (
        "local",
        "string",
        "Where phases run: 'local' (a process on the worker, the embedded default).",
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
    "shard_size": ("250", "integer", "Most cases in one shard DAG run (S)."),
    "max_active_shards": ("4", "integer", "Most shard DAG runs active at once (W)."),
    "gpu_spot_pool": ("avsim_gpu_spot", "string", "Airflow pool of GPU phases on spot nodes."),
    "gpu_on_demand_pool": ("avsim_gpu_on_demand", "string", "Airflow pool of GPU phases on on-demand nodes."),
    "cpu_pool": ("avsim_cpu", "string", "Airflow pool of CPU phases."),
    "shard_poll_seconds": ("10", "float", "How often the parent run checks its shard runs."),
    "max_manifest_bytes": ("67108864", "integer", "Largest manifest accepted, in bytes."),
}


@dataclass(frozen=True)
class AvsimSettings:
    backend: str = "local"
    artifact_root: str = ""
    graph_catalog: str = ""
    default_manifest: str = ""
    shard_size: int = 250
    max_active_shards: int = 4
    gpu_spot_pool: str = "avsim_gpu_spot"
    gpu_on_demand_pool: str = "avsim_gpu_on_demand"
    cpu_pool: str = "avsim_cpu"
    shard_poll_seconds: float = 10.0
    max_manifest_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
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


def load_settings() -> AvsimSettings:
    """Read ``[avsim]`` from Airflow's configuration (and its environment overrides)."""
    from airflow.configuration import conf

    def get(key: str) -> str:
        default = OPTIONS[key][0]
        return str(conf.get("avsim", key, fallback=default))

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
            shard_poll_seconds=float(get("shard_poll_seconds")),
            max_manifest_bytes=int(get("max_manifest_bytes")),
        )
    except ValueError as exc:
        raise ConfigError(f"[avsim] has a value of the wrong type: {exc}") from exc
