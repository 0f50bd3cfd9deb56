"""What the pod trigger fires: how a deferred Kubernetes phase's attempt ended, as its trigger saw it.

===================  ==========================================  =====================================
contract             written by                                  read by
===================  ==========================================  =====================================
:class:`PodEvent`    the pod trigger                             the operator where the phase resumes
                     (:class:`avsim.triggers.phase_pod.          (``phase_complete``), and the committing
                     PhasePodTrigger`), as the event's payload   trigger's own end (``end_here``)
===================  ==========================================  =====================================

Airflow keeps an event's payload in the task instance's ``next_kwargs`` until the phase resumes, maybe
under a newer avsim: the field names are the dict's it replaces, and every field but the pod, its
namespace and the attempt has a default, so an event fired before the model parses.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from avsim.contracts import _Contract
from avsim.phases.contract import AttemptResult, Detail, Outcome


class PodStatus(StrEnum):
    """Whether the trigger saw the attempt end, or could not tell (the worker then reads the pod)."""

    ENDED = "ended"
    ERROR = "error"


class PodEvent(_Contract):
    """The pod trigger's event for one attempt."""

    status: PodStatus
    pod: str = Field(min_length=1)
    namespace: str = Field(min_length=1)
    attempt: int = Field(ge=0)
    #: When the attempt started (ISO 8601; empty when the trigger was deferred without it).
    started_at: str = ""
    #: How the attempt ended (``ended`` only).
    outcome: Outcome | None = None
    exit_code: int | None = None
    reason: str = ""
    detail: Detail | Literal[""] = ""
    #: Why the trigger could not tell (``error`` only).
    message: str = ""

    def result(self) -> AttemptResult | None:
        """The attempt's end as the trigger saw it, its pod the runner; None when it could not tell."""
        if self.status is not PodStatus.ENDED or self.outcome is None:
            return None
        return AttemptResult(self.outcome, self.exit_code, self.reason, self.detail, self.pod)
