"""What the attempt service answers, and the task-side effects it asks for: typed, no Airflow.

:meth:`~avsim.attempt.service.AttemptService.begin` answers :class:`Launch` or an end (:class:`Done`,
:class:`Stop`), :meth:`~avsim.attempt.service.AttemptService.end` an end or :class:`HandOver`; the
adapter (:mod:`avsim.operators.lifecycle`) turns them into Airflow's terms. The service asks the task
(:class:`TaskSide`) to push how an attempt that committed nothing ended (XCom ``avsim_outcome``) and
to ready the on-demand twin before a hand-over, before the failure's commit and the hand-over.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Protocol

from avsim.attempt import PhaseAttempt
from avsim.contracts import PhaseResult
from avsim.errors import AvsimError
from avsim.phases.policy import Failure


@dataclass(frozen=True)
class Launch:
    """Launch this claimed attempt, then end it with :meth:`AttemptService.end`."""

    attempt: PhaseAttempt


@dataclass(frozen=True)
class Done:
    """The phase has its committed result: the task's return value (downstream phases' input)."""

    result: PhaseResult

    def xcom(self) -> dict[str, Any]:
        return self.result.to_json()


@dataclass(frozen=True)
class Stop:
    """The task fails with the exception of kind ``failure``; retried after ``retry_delay`` when set."""

    failure: Failure
    message: str
    retry_delay: dt.timedelta | None = None


@dataclass(frozen=True)
class HandOver:
    """A spot task hands its GPU phase over to its on-demand twin (``twin_task_id``): push ``case``
    and ``run`` for the twin, then end the task skipped with ``message``."""

    message: str
    case: dict[str, Any]
    run: dict[str, Any]
    twin_task_id: str


class MissingOutputs(AvsimError):
    """A passed attempt's declared outputs are missing, in an end that commits passes only (the
    committing trigger's): an infrastructure failure, which the worker decides; nothing is recorded."""


Begun = Launch | Done | Stop
Ended = Done | Stop | HandOver


class TaskSide(Protocol):
    """The effects on Airflow's side the service triggers (the operator adapter implements them)."""

    def publish(self, result: PhaseResult) -> None:
        """Push how an attempt that committed no result ended (XCom ``avsim_outcome``)."""

    def ready_twin(self) -> None:
        """Make sure the on-demand twin runs once this spot task ends skipped (may raise)."""


class Meter(Protocol):
    """Where the service's metrics go (:mod:`avsim.metrics`, which emits through Airflow's Stats)."""

    def phase_outcome(self, phase: str, outcome: str, resource_class: str, node_class: str) -> None: ...

    def gpu_seconds(self, phase: str, seconds: float, node_class: str) -> None: ...

    def preemption(self, phase: str, node_class: str) -> None: ...

    def breaker_trip(self, build_id: str, digest: str) -> None: ...


class NoTaskSide:
    """A task side with no Airflow behind it: the committing trigger (which publishes and hands over
    nothing) and tests."""

    def publish(self, result: PhaseResult) -> None:
        return None

    def ready_twin(self) -> None:
        return None
