"""Exceptions a phase task raises: one per way an attempt ends unsuccessfully.

Airflow's retry machinery sees the class: bad input, a bad build and a used-up budget fail fast
(``AirflowFailException``); an infrastructure failure and a preemption are retried after their own
delay (``retry_delay``, read by :class:`avsim.operators.retry.PhaseRetryPolicy`); a hand-over to the
on-demand twin is a skip. The specific classes say what the platform did; their message names the
pod or process, the case and the phase. A user's kill is :class:`PhaseKilled`.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from avsim.phases.contract import Outcome
from avsim.phases.policy import Failure


class PhaseBadInput(AirflowFailException):
    """The phase's input is malformed (exit code 65): never retried."""


class PhaseBadBuild(AirflowFailException):
    """The build under test cannot run (its image does not pull) or its circuit breaker is open."""


class ImagePullFailed(PhaseBadBuild):
    """The pod's image could not be pulled (ErrImagePull, ImagePullBackOff, InvalidImageName)."""


class BreakerOpen(PhaseBadBuild):
    """The build's circuit breaker is open: nothing of this build is launched."""


class PhaseBudgetExhausted(AirflowFailException):
    """The phase used up the retry budget of its failure class; the last failure is committed."""


class PhaseRetriable(AirflowException):
    """An attempt failed for a reason a retry can fix; retried after ``retry_delay``."""

    outcome = Outcome.INFRA_FAILED

    def __init__(self, message: str, retry_delay: dt.timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_delay = retry_delay


class PhaseInfrastructureError(PhaseRetriable):
    """The phase crashed, timed out or lost its worker: retried within the infrastructure budget."""


class OutOfMemory(PhaseInfrastructureError):
    """The phase's container was OOM-killed."""


class LeaseExpired(PhaseInfrastructureError):
    """The phase stopped renewing its heartbeat for longer than its lease: it was ended."""


class PhasePreempted(PhaseRetriable):
    """The phase's node was reclaimed, drained or lost: retried within the preemption budget, resuming
    from its newest checkpoint."""

    outcome = Outcome.PREEMPTED


class PodEvicted(PhasePreempted):
    """The pod was evicted (a DisruptionTarget condition, status reason Evicted)."""


class PodVanished(PhasePreempted):
    """The spot pod disappeared from the API, or its node was lost: the capacity was reclaimed."""


class PodLost(PhaseInfrastructureError):
    """The pod disappeared from the API, or its node was lost, off spot capacity: an infrastructure
    failure (a lost CPU or on-demand node is broken capacity, not reclaimed capacity)."""


class PhaseFallbackToOnDemand(AirflowSkipException):
    """Preempted too often on spot nodes: the phase's on-demand twin task runs the next attempt."""


class RunRejected(AirflowFailException):
    """The run's manifest or conf was rejected: fail fast, name the field and the fix."""


class CanaryGateFailed(AirflowFailException):
    """The canary's crash and bad-build rate passed the threshold: the rest of the week is not started."""


class CanaryGateStalled(AirflowFailException):
    """The canary gate cannot decide: the ``canary`` task ended without running the canary this round."""


class ShardNeedsAttention(AirflowFailException):
    """A shard run's cases ended with failures an engineer must look at (:mod:`avsim.verdict`): the
    summary is written; the shard run, and its map index in the weekly run, end failed."""


class WeekNeedsAttention(AirflowFailException):
    """The week's report is written, but cases need attention or never started: the weekly run fails."""


class RepairFailed(AirflowFailException):
    """A cleared ``shards`` task could not clear its shard run's failed task instances."""


class PhaseKilled(Exception):
    """A user (or Airflow) killed the running phase through its operator's ``on_kill``; its attempt is
    not recorded (the task instance's state is the user's, the next try records the attempt as lost)."""


#: The exception class of each kind of failure the failure policy names (:mod:`avsim.phases.policy`).
FAILURE_EXCEPTIONS: dict[Failure, type[Exception]] = {
    Failure.BAD_INPUT: PhaseBadInput,
    Failure.BAD_BUILD: PhaseBadBuild,
    Failure.IMAGE_PULL: ImagePullFailed,
    Failure.BREAKER_OPEN: BreakerOpen,
    Failure.BUDGET_EXHAUSTED: PhaseBudgetExhausted,
    Failure.HAND_OVER: PhaseFallbackToOnDemand,
    Failure.INFRASTRUCTURE: PhaseInfrastructureError,
    Failure.OUT_OF_MEMORY: OutOfMemory,
    Failure.LEASE_EXPIRED: LeaseExpired,
    Failure.POD_LOST: PodLost,
    Failure.PREEMPTED: PhasePreempted,
    Failure.EVICTED: PodEvicted,
    Failure.NODE_RECLAIMED: PodVanished,
}
