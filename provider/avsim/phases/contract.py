"""The phase contract: what a phase process is given and what its exit code means.

The same contract holds for every backend (a local process, a Kubernetes pod):
the phase reads its identity and artifact locations from the environment, and
its exit code says which of four outcome classes the attempt belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

#: Exit codes. Anything not listed here is an infrastructure failure.
EXIT_PASSED = 0
#: The driving software failed the scenario: a result to record, never retried.
EXIT_SCENARIO_FAILED = 3
#: The phase's input is malformed (sysexits EX_DATAERR): fail fast, never retried.
EXIT_BAD_INPUT = 65

#: Environment variable names given to every phase process.
ENV_RUN_ID = "RUN_ID"
ENV_CASE_ID = "CASE_ID"
ENV_PHASE = "PHASE"
ENV_ATTEMPT = "ATTEMPT"
ENV_SEED = "SEED"
ENV_INPUT_URIS = "INPUT_URIS"  # JSON object: upstream phase name -> committed output URI
ENV_SCENARIO_URI = "SCENARIO_URI"
ENV_SCENARIO_VERSION = "SCENARIO_VERSION"
ENV_OUTPUT_URI = "OUTPUT_URI"  # attempt-scoped prefix this attempt writes under
ENV_CHECKPOINT_URI = "CHECKPOINT_URI"  # empty when the phase does not checkpoint
ENV_PARAMETERS = "PARAMETERS"  # JSON object of the case's parameters
ENV_BUILD_ID = "BUILD_ID"
ENV_IMAGE = "IMAGE"

#: Variables the contract sets; a manifest's pod env may not override them.
RESERVED_ENV = frozenset(
    {
        ENV_RUN_ID,
        ENV_CASE_ID,
        ENV_PHASE,
        ENV_ATTEMPT,
        ENV_SEED,
        ENV_INPUT_URIS,
        ENV_SCENARIO_URI,
        ENV_SCENARIO_VERSION,
        ENV_OUTPUT_URI,
        ENV_CHECKPOINT_URI,
        ENV_PARAMETERS,
        ENV_BUILD_ID,
        ENV_IMAGE,
    }
)

#: The file a phase writes under OUTPUT_URI to describe its result.
RESULT_FILE = "result.json"


class Outcome(str, Enum):
    """The class of one attempt's ending."""

    PASSED = "passed"
    SCENARIO_FAILED = "scenario_failed"
    BAD_INPUT = "bad_input"
    INFRA_FAILED = "infra_failed"
    #: Not run because an upstream phase of the case did not produce output.
    UPSTREAM_FAILED = "upstream_failed"

    @property
    def produced_output(self) -> bool:
        """Whether downstream phases of the case can consume this attempt's output."""
        return self in (Outcome.PASSED, Outcome.SCENARIO_FAILED)

    @property
    def retriable(self) -> bool:
        return self is Outcome.INFRA_FAILED


def classify_exit_code(code: int) -> Outcome:
    """Map a phase process's exit code (negative for a signal) to its outcome class."""
    if code == EXIT_PASSED:
        return Outcome.PASSED
    if code == EXIT_SCENARIO_FAILED:
        return Outcome.SCENARIO_FAILED
    if code == EXIT_BAD_INPUT:
        return Outcome.BAD_INPUT
    return Outcome.INFRA_FAILED


@dataclass(frozen=True)
class PhaseIdentity:
    run_id: str
    case_id: str
    phase: str
    attempt: int
