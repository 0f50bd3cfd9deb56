"""What the attempt service is told about a phase task and its try: two frozen values, no Airflow.

:class:`PhaseArgs` is the one declaration of a phase task's arguments: the operators take its fields
as their keywords (:func:`avsim.operators.lifecycle.phase_keywords`) and build it from them rendered;
the committing trigger builds it from its ``PassCommit``. :class:`TryView` is what the service reads
of Airflow's task instance; the service (:mod:`avsim.attempt.service`) reads nothing else of the task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
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
    def of(cls, **fields: Any) -> PhaseArgs:
        """The arguments from an operator's rendered fields, named as this class's: ``case`` as a
        mapping, ``run`` as a mapping, a descriptor or its JSON (:func:`avsim.contracts.run_document`),
        ``upstream_phases`` as one id or several per phase, ``inputs`` as a mapping or nothing."""
        return cls(**{name: _COERCE.get(name, _same)(value) for name, value in fields.items()})

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


def _same(value: Any) -> Any:
    return value


def _case(value: Any) -> CaseEntry:
    return value if isinstance(value, CaseEntry) else CaseEntry.model_validate(dict(value or {}))


def _descriptor(value: Any) -> RunDescriptor | None:
    if isinstance(value, RunDescriptor):
        return value
    doc = run_document(value)
    return RunDescriptor.model_validate(doc) if doc is not None else None


#: How :meth:`PhaseArgs.of` reads an operator's rendered field (any other is taken as it is).
_COERCE: dict[str, Callable[[Any], Any]] = {
    "case": _case,
    "run": _descriptor,
    "upstream_phases": upstream_task_ids,
    "inputs": lambda value: dict(value) if value else None,
    "role": Role,
    "gpus": int,
    "reuse_outputs": bool,
}

#: The phase arguments an operator takes as keywords and keeps as its fields: all but its own
#: ``task_id`` and ``retries``.
OPERATOR_FIELDS = tuple(f for f in dataclasses.fields(PhaseArgs) if f.name not in {"task_id", "retries"})


@dataclass(frozen=True)
class ResolvedInputs:
    """The attempt's inputs: upstream phase -> committed output URI, and -> that output's cache key
    (empty for fixed inputs). The task reads them from its upstream phases' results."""

    uris: Mapping[str, str]
    upstream_keys: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TryView:
    """What the service reads of Airflow's task instance: its try, its last try, its map index; and
    ``round_first``, the first try of its round when known without them (the committing trigger's)."""

    try_number: int
    max_tries: int
    map_index: int = -1
    round_first: int | None = None

    def round_start(self, retries: int | None) -> int:
        """The first try of the task's current round (a clear starts a new round with fresh budgets)."""
        if self.round_first is not None:
            return self.round_first
        return max(1, self.max_tries - int(retries or 0) + 1)

    @property
    def is_last(self) -> bool:
        """Whether Airflow will not retry this try whatever the decision says."""
        return self.try_number > self.max_tries
