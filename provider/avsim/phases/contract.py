"""The phase contract: what a phase process is given and what its ending means.

The same contract holds for every backend (a local process, a Kubernetes pod): the phase
reads its identity and artifact locations from the environment, renews its heartbeat while
it makes progress, and its exit code says which outcome class the attempt belongs to. What
the platform did to the attempt (a spot reclaim, an eviction, an OOM kill, a lost node, an
image that does not pull, a heartbeat that stopped) is classified by the backend into the
same classes (see :class:`Outcome`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum, StrEnum

#: Exit codes. Anything not listed here is an infrastructure failure.
EXIT_PASSED = 0
#: The driving software failed the scenario: a result to record, never retried.
EXIT_SCENARIO_FAILED = 3
#: The phase's input is malformed (sysexits EX_DATAERR): fail fast, never retried.
EXIT_BAD_INPUT = 65
#: Terminated by SIGTERM (128 + 15), as a spot reclaim or a node drain ends a process: preempted.
EXIT_TERMINATED = 143

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
#: Where the phase renews its heartbeat (see :mod:`avsim.phases.heartbeat`); empty: no heartbeat.
ENV_HEARTBEAT_FILE = "AVSIM_HEARTBEAT_FILE"  # local backend: a file whose mtime is the heartbeat
ENV_LEASE_NAME = "AVSIM_LEASE_NAME"  # kubernetes backend: a coordination.k8s.io Lease to renew
ENV_LEASE_NAMESPACE = "AVSIM_LEASE_NAMESPACE"
ENV_HEARTBEAT_SECONDS = "AVSIM_HEARTBEAT_SECONDS"  # how often to renew
ENV_NODE_CLASS = "AVSIM_NODE_CLASS"  # gpu-spot | gpu-on-demand | cpu

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
        ENV_HEARTBEAT_FILE,
        ENV_LEASE_NAME,
        ENV_LEASE_NAMESPACE,
        ENV_HEARTBEAT_SECONDS,
        ENV_NODE_CLASS,
    }
)

#: The file a phase writes under OUTPUT_URI to describe its result.
RESULT_FILE = "result.json"
#: The key of ``result.json`` that lists the other files the phase wrote under OUTPUT_URI (names
#: relative to it): with ``result.json`` itself, the outputs a phase declares.
RESULT_ARTIFACTS = "artifacts"


class Outcome(str, Enum):
    """The class of one attempt's ending.

    ======================  ==========================================================  ====================
    class                   what happened                                               what avsim does
    ======================  ==========================================================  ====================
    ``passed``              the scenario passed                                         commit; downstream runs
    ``scenario_failed``     the driving software failed the scenario                    commit as a result;
                                                                                        downstream runs; no retry
    ``bad_input``           the phase's input is malformed                              fail fast, no retry
    ``infra_failed``        crash, OOM, timeout, lost worker, heartbeat stopped         retry (infrastructure budget)
    ``preempted``           spot reclaim, eviction, node drain or loss                  retry (preemption budget), resume
                                                                                        from checkpoint; on-demand after N
    ``bad_build``           the build's image does not pull, or its breaker is open     fail fast, no retry
    ======================  ==========================================================  ====================
    """

    PASSED = "passed"
    SCENARIO_FAILED = "scenario_failed"
    BAD_INPUT = "bad_input"
    INFRA_FAILED = "infra_failed"
    PREEMPTED = "preempted"
    BAD_BUILD = "bad_build"
    #: Not run because an upstream phase of the case did not produce output.
    UPSTREAM_FAILED = "upstream_failed"

    @property
    def produced_output(self) -> bool:
        """Whether downstream phases of the case can consume this attempt's output."""
        return self in (Outcome.PASSED, Outcome.SCENARIO_FAILED)

    @property
    def retriable(self) -> bool:
        return self in (Outcome.INFRA_FAILED, Outcome.PREEMPTED)

    @property
    def counts_against_build(self) -> bool:
        """Whether the attempt is evidence of a bad build (canary gate, circuit breaker)."""
        return self in (Outcome.INFRA_FAILED, Outcome.BAD_BUILD)


#: Every class an attempt can end in, in the order counts, legends and tables list them: results first.
ENDED: tuple[Outcome, ...] = (
    Outcome.PASSED,
    Outcome.SCENARIO_FAILED,
    Outcome.BAD_INPUT,
    Outcome.INFRA_FAILED,
    Outcome.PREEMPTED,
    Outcome.BAD_BUILD,
)
#: The regression run's results: classes that never need an engineer.
RESULTS: frozenset[Outcome] = frozenset(o for o in ENDED if o.produced_output)
#: A phase of a case that never ran because the case stopped before it (not an attempt's class).
NOT_RUN = "not_run"
#: The one precedence of case classes: a case takes the first class in this list that one of its
#: phases gives (:func:`case_class`), the most specific reason first: bad input, a bad build, an
#: exhausted preemption budget, any other infrastructure failure, a failed scenario; else passed.
#: The ledger's shard summaries, the verdict, the report and the page (whose SQL is generated from
#: it, :mod:`avsim.ui.progress`) all class cases by it.
CASE_PRECEDENCE: tuple[Outcome, ...] = (
    Outcome.BAD_INPUT,
    Outcome.BAD_BUILD,
    Outcome.PREEMPTED,
    Outcome.INFRA_FAILED,
    Outcome.SCENARIO_FAILED,
    Outcome.PASSED,
)
#: The phase classes that give a case each class of :data:`CASE_PRECEDENCE`, in the order the
#: phase that gave it is looked for: a phase that never ran (not run, upstream failed) makes its
#: case an infrastructure failure, and a failed phase beats the phases it stopped.
PHASES_GIVING: dict[Outcome, tuple[str, ...]] = {
    c: (c.value,) if c is not Outcome.INFRA_FAILED else (c.value, NOT_RUN, Outcome.UPSTREAM_FAILED.value)
    for c in CASE_PRECEDENCE
}


def case_class(phase_outcomes: Iterable[str | Outcome]) -> Outcome:
    """The class of a case from its phases' classes (serialized names or :class:`Outcome`).

    The first class of :data:`CASE_PRECEDENCE` one of the phases gives; a phase class outside the
    vocabulary counts as an infrastructure failure, and a case without phases passed.
    """
    seen = {o.value if isinstance(o, Outcome) else str(o) for o in phase_outcomes}
    known = {p for phases in PHASES_GIVING.values() for p in phases}
    for cls in CASE_PRECEDENCE:
        if seen & set(PHASES_GIVING[cls]) or (cls is Outcome.INFRA_FAILED and seen - known):
            return cls
    return Outcome.PASSED


#: Failures in the order lists give them (the report's failed cases, the verdict's counts, the page's
#: failed phases): what needs an engineer first (a bad build stops the week), a failed scenario last.
#: A listing order only: the class a case takes is :func:`case_class`'s.
FAILURE_ORDER: tuple[Outcome, ...] = (
    Outcome.BAD_BUILD,
    Outcome.BAD_INPUT,
    Outcome.INFRA_FAILED,
    Outcome.PREEMPTED,
    Outcome.SCENARIO_FAILED,
)


def values(outcomes: tuple[Outcome, ...] | frozenset[Outcome]) -> tuple[str, ...]:
    """The serialized names of ``outcomes`` (in their order; a set's in :data:`ENDED` order)."""
    if isinstance(outcomes, frozenset):
        return tuple(o.value for o in ENDED if o in outcomes)
    return tuple(o.value for o in outcomes)


def classify_exit_code(code: int) -> Outcome:
    """Map a phase process's exit code (negative for a signal) to its outcome class."""
    if code == EXIT_PASSED:
        return Outcome.PASSED
    if code == EXIT_SCENARIO_FAILED:
        return Outcome.SCENARIO_FAILED
    if code == EXIT_BAD_INPUT:
        return Outcome.BAD_INPUT
    if code in (EXIT_TERMINATED, -15):
        return Outcome.PREEMPTED
    return Outcome.INFRA_FAILED


#: Node classes: where an attempt runs (Airflow pools and Kubernetes node selectors follow them).
NODE_SPOT = "gpu-spot"
NODE_ON_DEMAND = "gpu-on-demand"
NODE_CPU = "cpu"


class Detail(StrEnum):
    """What the platform did to an attempt, in a word: refines its :class:`Outcome` (the failure
    policy picks an exception kind by it, :func:`avsim.phases.policy.failure_for`). Serialized as
    its value; an attempt with nothing to add has the empty detail."""

    CRASH = "crash"
    OOM = "oom"
    TIMEOUT = "timeout"
    #: The pod did not start in time (the trigger's startup timeout).
    STARTUP_TIMEOUT = "startup_timeout"
    TERMINATED = "terminated"
    EVICTED = "evicted"
    NODE_SHUTDOWN = "node_shutdown"
    #: The pod's node stopped reporting (a lost node).
    NODE_LOST = "node_lost"
    #: The pod disappeared from the API before it ended.
    VANISHED = "vanished"
    LEASE_EXPIRED = "lease_expired"
    IMAGE_PULL = "image_pull"
    BREAKER_OPEN = "breaker_open"
    #: No report from a lost worker, recorded by the next try.
    ABANDONED = "abandoned"
    #: The phase saw its worker die.
    WORKER_LOST = "worker_lost"
    REUSED = "reused"
    #: A result whose declared outputs are missing (:func:`classify_outputs`).
    MISSING_OUTPUT = "missing_output"
    #: The local phase's process could not be started.
    SPAWN = "spawn"
    #: The pod trigger could not watch the pod, and the worker could not read it either.
    WATCH_ERROR = "watch_error"


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended, as the backend saw it."""

    outcome: Outcome
    exit_code: int | None = None
    reason: str = ""
    #: What the platform did, in a word (a :class:`Detail`; empty when there is nothing to add).
    detail: str = ""
    #: The pod or process that ran it.
    runner: str = ""


#: The detail of a result (exit 0 or 3) whose declared outputs are not in the artifact store: an
#: infrastructure failure (see :func:`classify_outputs`).
MISSING_OUTPUT = Detail.MISSING_OUTPUT


def declared_outputs(result_doc: object) -> tuple[str, ...]:
    """The files a phase declares under its OUTPUT_URI: :data:`RESULT_FILE`, and every file its
    ``result.json`` (``result_doc``, None when unreadable) lists under :data:`RESULT_ARTIFACTS`."""
    listed = result_doc.get(RESULT_ARTIFACTS) if isinstance(result_doc, dict) else None
    names = (
        [str(n).strip("/") for n in listed if isinstance(n, str) and n.strip("/")]
        if isinstance(listed, list)
        else []
    )
    return (RESULT_FILE, *dict.fromkeys(n for n in names if n != RESULT_FILE))


def classify_outputs(result: AttemptResult, missing: Sequence[str]) -> AttemptResult:
    """The contract's check of a result against its outputs: an attempt that reported a result (passed,
    scenario_failed) but left ``missing`` of its declared outputs out of the artifact store ends
    ``infra_failed``/``missing_output``. A lost write is far more often the storage's or the node's than
    the simulator's; it is retried within the infrastructure budget into a fresh attempt-scoped prefix,
    and a build that never writes them fails every first attempt, which the breaker counts. Anything
    else is returned unchanged."""
    if not result.outcome.produced_output or not missing:
        return result
    was = f"exit {result.exit_code}" if result.exit_code is not None else result.outcome.value
    reason = f"{was} ({result.outcome.value}) but its declared outputs are missing: {', '.join(missing)}"
    return replace(
        result,
        outcome=Outcome.INFRA_FAILED,
        reason=f"{reason}; {result.reason}" if result.reason else reason,
        detail=MISSING_OUTPUT,
    )
