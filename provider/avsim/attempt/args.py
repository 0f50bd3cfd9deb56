"""What the attempt service is told about a phase task and its try: two frozen values, no Airflow.

:class:`PhaseArgs` is the one declaration of a phase task's arguments (the operators keep their
constructor keywords, which Airflow's ``partial``/``expand`` check against their signatures, and
build it from their rendered fields); :class:`TryView` is what the service reads of Airflow's task
instance. The operators (:mod:`avsim.operators.lifecycle`) and the committing trigger
(:mod:`avsim.operators.pass_commit`) build both; the service (:mod:`avsim.attempt.service`) reads
nothing else of the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from avsim.artifacts import RUN_LEVEL_CASE
from avsim.contracts import RunDescriptor, run_document
from avsim.contracts.case import CaseEntry
from avsim.phases import policy
from avsim.phases.policy import Role


def upstream_task_ids(upstream: Mapping[str, str | Sequence[str]] | None) -> dict[str, tuple[str, ...]]:
    """Normalise ``upstream phase -> task id(s)``: one task, or a GPU phase's spot task and on-demand twin."""
    return {k: (v,) if isinstance(v, str) else tuple(v) for k, v in (upstream or {}).items()}


@dataclass(frozen=True, kw_only=True)
class PhaseArgs:
    """One phase task's arguments, as rendered for the try that runs it.

    :param phase: the phase name (as in the graph).
    :param case: the case entry (the mapped group's argument, validated here).
    :param run: the run descriptor (None when the task's ``run`` did not render to one: the service
        fails with the reason when it needs it).
    :param task_id: the task's id (a twin's ends with the on-demand suffix).
    :param upstream_phases: upstream phase name -> task id(s) whose committed output is an input.
    :param inputs: fixed inputs (name -> URI), for run-level phases; None when read from upstream.
    :param role: ``regular``, or ``spot`` / ``on_demand`` for a GPU phase with an on-demand twin.
    :param gpus: GPUs the phase takes (its node class follows: cpu, gpu-spot, gpu-on-demand).
    :param reuse_outputs: commit a cached result with the same cache key instead of launching.
    :param retries: the task's ``retries`` (a clear starts a new round of that many tries).
    """

    phase: str
    case: CaseEntry
    run: RunDescriptor | None
    task_id: str
    upstream_phases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    inputs: Mapping[str, str] | None = None
    role: Role = Role.REGULAR
    gpus: int = 0
    reuse_outputs: bool = True
    retries: int | None = None

    @classmethod
    def of(
        cls,
        *,
        phase: str,
        case: Any,
        run: Any,
        task_id: str,
        upstream_phases: Mapping[str, str | Sequence[str]] | None = None,
        inputs: Any = None,
        role: Role | str = Role.REGULAR,
        gpus: int = 0,
        reuse_outputs: bool = True,
        retries: int | None = None,
    ) -> PhaseArgs:
        """The arguments from an operator's rendered fields: ``run`` as a mapping, a descriptor or its
        JSON (:func:`avsim.contracts.run_document`), ``upstream_phases`` as one id or several."""
        if isinstance(run, RunDescriptor):
            descriptor: RunDescriptor | None = run
        else:
            doc = run_document(run)
            descriptor = RunDescriptor.model_validate(doc) if doc is not None else None
        return cls(
            phase=phase,
            case=case if isinstance(case, CaseEntry) else CaseEntry.model_validate(dict(case or {})),
            run=descriptor,
            task_id=task_id,
            upstream_phases=upstream_task_ids(upstream_phases),
            inputs=dict(inputs) if inputs else None,
            role=Role(role),
            gpus=int(gpus),
            reuse_outputs=bool(reuse_outputs),
            retries=retries,
        )

    @property
    def case_id(self) -> str:
        return self.case.case_id

    @property
    def node_class(self) -> str:
        return policy.node_class_for(self.gpus, self.role)

    @property
    def is_run_level(self) -> bool:
        return self.case.case_id == RUN_LEVEL_CASE

    def where(self, attempt: int | None = None) -> str:
        """The phase, case and attempt in words, for logs and exception messages."""
        tail = f" (attempt {attempt})" if attempt else ""
        return f"phase {self.phase!r} of case {self.case.case_id!r}{tail}"


@dataclass(frozen=True)
class TryView:
    """What the service reads of Airflow's task instance: its try, its last try, its map index."""

    try_number: int
    max_tries: int
    map_index: int = -1

    def round_start(self, retries: int | None) -> int:
        """The first try of the task's current round (a clear starts a new round with fresh budgets)."""
        return max(1, self.max_tries - int(retries or 0) + 1)

    @property
    def is_last(self) -> bool:
        """Whether Airflow will not retry this try whatever the decision says."""
        return self.try_number > self.max_tries
