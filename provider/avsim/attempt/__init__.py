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
from avsim.contracts.case import CaseEntry
from avsim.manifest.models import PhaseSpec, PodOverrides, RetrySpec
from avsim.phases import contract


@dataclass(frozen=True)
class PhaseRuntime:
    """What a phase runs, read at run time from the manifest snapshot (or the case's own phases) with
    :meth:`from_spec`: no default of its own, the manifest's model has them."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    timeout_seconds: float
    checkpoint: bool
    estimated_seconds: float
    gpus: int
    cpus: float
    memory: str
    heartbeat_seconds: float
    lease_seconds: float
    retry: RetrySpec
    pod: PodOverrides
    #: The spec as written in the snapshot (what the cache key covers).
    spec: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> PhaseRuntime:
        """The runtime of a phase spec as the run's snapshot holds it, read through the manifest's own
        model (:class:`avsim.manifest.models.PhaseSpec`; a run-level phase's spec is the same without
        ``checkpoint`` and ``pod``), so its defaults and checks are the manifest's: a snapshot edited
        after validation is refused here too."""
        m = PhaseSpec.model_validate(spec)
        return cls(
            command=tuple(m.command),
            args=tuple(m.args),
            timeout_seconds=float(m.timeout_seconds),
            checkpoint=bool(m.checkpoint),
            estimated_seconds=float(m.estimated_duration_seconds),
            gpus=int(m.resources.gpus),
            cpus=float(m.resources.cpus),
            memory=str(m.resources.memory),
            heartbeat_seconds=float(m.heartbeat_seconds),
            lease_seconds=float(m.lease_seconds),
            retry=m.retry,
            pod=m.pod,
            spec=dict(spec),
        )


@dataclass(frozen=True)
class PhaseAttempt:
    layout: RunLayout
    case: CaseEntry
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
        return self.case.case_id

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
            contract.ENV_SEED: str(self.case.seed),
            contract.ENV_INPUT_URIS: json.dumps(self.inputs, sort_keys=True),
            contract.ENV_SCENARIO_URI: self.case.scenario_uri,
            contract.ENV_SCENARIO_VERSION: self.case.scenario_version,
            contract.ENV_OUTPUT_URI: self.output_uri,
            contract.ENV_CHECKPOINT_URI: self.checkpoint_uri,
            contract.ENV_PARAMETERS: json.dumps(self.case.parameters, sort_keys=True),
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
