"""Retry classes on top of Airflow 3.3's retry policies.

Airflow gives a task one retry count and one backoff. avsim's phases have one budget and one
backoff per failure class (infrastructure, preemption; bad input and a failed scenario are never
retried). The split of work:

* the task's ``retries`` is the sum of the class budgets it may use
  (:func:`avsim.phases.policy.task_retries`), so Airflow never stops a phase before one of its
  budgets is used up;
* the failure policy (:func:`avsim.phases.policy.decide`) decides from the task's attempts in its
  current round of tries whether to retry, after which delay, or to give up; the phase's
  lifecycle (:mod:`avsim.operators.lifecycle`) raises the exception the decision names, a
  retriable one carrying that class's delay;
* :class:`PhaseRetryPolicy` (a ``RetryPolicy``, evaluated in the worker) hands that delay to
  Airflow. A try the scheduler fails for a missed heartbeat (a lost worker) never reaches a
  policy: Airflow retries it after the task's ``retry_delay`` (the infrastructure delay), and the
  next try records the lost attempt as an infrastructure failure before it counts the budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy

from avsim.operators.exceptions import PhaseRetriable

if TYPE_CHECKING:
    from airflow.sdk import Context


class PhaseRetryPolicy(RetryPolicy):
    """Retry a phase after the delay its failure class asks for; anything else: Airflow's default."""

    def evaluate(
        self, exception: BaseException, try_number: int, max_tries: int, context: Context | None = None
    ) -> RetryDecision:
        if isinstance(exception, PhaseRetriable):
            return RetryDecision.retry(
                delay=exception.retry_delay,
                reason=f"{exception.outcome.value}: retry after {exception.retry_delay}",
            )
        return RetryDecision.default()

    def serialize(self) -> dict[str, Any]:
        return {}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> PhaseRetryPolicy:
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PhaseRetryPolicy)

    def __hash__(self) -> int:
        return hash(type(self))
