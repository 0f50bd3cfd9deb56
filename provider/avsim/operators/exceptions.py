"""Exceptions a phase task raises, one per outcome class that ends the task unsuccessfully.

Airflow's retry machinery sees the class: bad input fails fast (no retry);
an infrastructure failure is retried within the phase's budget.
"""

from __future__ import annotations

from airflow.sdk.exceptions import AirflowException, AirflowFailException


class PhaseBadInput(AirflowFailException):
    """The phase's input is malformed (exit code 65): never retried."""


class PhaseInfrastructureError(AirflowException):
    """The phase crashed, timed out or lost its machine: retried within the infrastructure budget."""


class RunRejected(AirflowFailException):
    """The run's manifest or conf was rejected: fail fast, name the field and the fix."""
