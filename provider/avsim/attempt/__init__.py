"""One attempt of one phase, independent of the backend that runs it.

The backend (a local process, a Kubernetes pod) only launches the phase with
:meth:`PhaseAttempt.environment` and reports the exit code; everything the
contract says about that code, and what gets recorded, lives here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from avsim.artifacts import RunLayout
from avsim.manifest.models import PodOverrides, RetrySpec
from avsim.phases import contract


@dataclass(frozen=True)
class PhaseRuntime:
    """What a phase runs, read at run time from the manifest snapshot (or the case's own phases)."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    timeout_seconds: float
    checkpoint: bool
    estimated_seconds: float
    gpus: int = 0
    cpus: float = 1.0
    memory: str = "2Gi"
    heartbeat_seconds: float = 60.0
    lease_seconds: float = 300.0
    retry: RetrySpec = field(default_factory=RetrySpec)
    pod: PodOverrides = field(default_factory=PodOverrides)
    #: The spec as written in the snapshot (what the cache key covers).
    spec: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> PhaseRuntime:
        res = spec.get("resources", {})
        return cls(
            command=tuple(spec["command"]),
            args=tuple(spec.get("args", ())),
            timeout_seconds=float(spec["timeout_seconds"]),
            checkpoint=bool(spec.get("checkpoint", False)),
            estimated_seconds=float(spec["estimated_duration_seconds"]),
            gpus=int(res.get("gpus", 0)),
            cpus=float(res.get("cpus", 1)),
            memory=str(res.get("memory", "2Gi")),
            heartbeat_seconds=float(spec.get("heartbeat_seconds", 60)),
            lease_seconds=float(spec.get("lease_seconds", 300)),
            retry=RetrySpec.model_validate(spec.get("retry") or {}),
            pod=PodOverrides.model_validate(spec.get("pod") or {}),
            spec=dict(spec),
        )


@dataclass(frozen=True)
class PhaseAttempt:
    layout: RunLayout
    case: dict[str, Any]
    phase: str
    attempt: int
    runtime: PhaseRuntime
    build_id: str
    image: str
    #: upstream phase name -> committed output URI of that phase
    inputs: dict[str, str] = field(default_factory=dict)
    #: gpu-spot | gpu-on-demand | cpu: where the attempt runs
    node_class: str = ""
    #: Extra environment the backend adds (heartbeat location, ...).
    extra_env: dict[str, str] = field(default_factory=dict)
    #: What a committed result of this attempt is cached under ("" for run-level phases).
    cache_key: str = ""

    @property
    def case_id(self) -> str:
        return str(self.case["case_id"])

    @property
    def output_uri(self) -> str:
        return self.layout.attempt_output(self.case_id, self.phase, self.attempt)

    @property
    def checkpoint_uri(self) -> str:
        return self.layout.checkpoint(self.case_id, self.phase) if self.runtime.checkpoint else ""

    def environment(self) -> dict[str, str]:
        """The contract's environment for the phase process."""
        return {
            contract.ENV_RUN_ID: self.layout.run_key,
            contract.ENV_CASE_ID: self.case_id,
            contract.ENV_PHASE: self.phase,
            contract.ENV_ATTEMPT: str(self.attempt),
            contract.ENV_SEED: str(self.case.get("seed", 0)),
            contract.ENV_INPUT_URIS: json.dumps(self.inputs, sort_keys=True),
            contract.ENV_SCENARIO_URI: str(self.case.get("scenario_uri", "")),
            contract.ENV_SCENARIO_VERSION: str(self.case.get("scenario_version", "")),
            contract.ENV_OUTPUT_URI: self.output_uri,
            contract.ENV_CHECKPOINT_URI: self.checkpoint_uri,
            contract.ENV_PARAMETERS: json.dumps(self.case.get("parameters", {}), sort_keys=True),
            contract.ENV_BUILD_ID: self.build_id,
            contract.ENV_IMAGE: self.image,
            contract.ENV_NODE_CLASS: self.node_class,
            contract.ENV_HEARTBEAT_SECONDS: f"{self.runtime.heartbeat_seconds:g}",
            **self.extra_env,
        }

    def with_attempt(self, attempt: int, **changes: Any) -> PhaseAttempt:
        import dataclasses

        return dataclasses.replace(self, attempt=attempt, **changes)

    @property
    def argv(self) -> list[str]:
        return [*self.runtime.command, *self.runtime.args]


def phase_spec_for(head: dict[str, Any], case: dict[str, Any], phase: str) -> dict[str, Any]:
    """The runtime spec of ``phase`` for ``case``: its own phases if it defines them, else its graph's."""
    own = case.get("phases")
    if own:
        return dict(own[phase])
    graph = case.get("graph") or case.get("family")
    return dict(head["graphs"][graph]["phases"][phase])
