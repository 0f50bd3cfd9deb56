"""Retry classes on top of Airflow 3.3's retry policies.

A task's ``retries`` is the sum of its class budgets; the failure policy decides each retry and its
delay, and :class:`PhaseRetryPolicy` (evaluated in the worker) hands that delay to Airflow; a lost
worker's try is retried after the task's ``retry_delay`` (docs/design.md, "Retry classes and budgets").
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
