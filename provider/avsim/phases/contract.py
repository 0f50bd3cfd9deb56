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

    # What avsim does with each class is its row of CLASS_RULES, the one place a class is described:
    # a new class is a member here and a row there.
    PASSED = "passed"
    SCENARIO_FAILED = "scenario_failed"
    BAD_INPUT = "bad_input"
    INFRA_FAILED = "infra_failed"
    PREEMPTED = "preempted"
    BAD_BUILD = "bad_build"
    #: Not run because an upstream phase of the case did not produce output.
    UPSTREAM_FAILED = "upstream_failed"

    @property
    def rules(self) -> ClassRules:
        return CLASS_RULES[self]

    @property
    def produced_output(self) -> bool:
        """Whether downstream phases of the case can consume this attempt's output."""
        return self.rules.produced_output

    @property
    def retriable(self) -> bool:
        return self.rules.budget is not Budget.NONE

    @property
    def counts_against_build(self) -> bool:
        """Whether the attempt is evidence of a bad build (canary gate, circuit breaker)."""
        return self.rules.counts_against_build


class Budget(StrEnum):
    """The retry budget a failure of a class spends (the manifest's ``retry`` has one per kind)."""

    NONE = "none"  # never retried
    INFRASTRUCTURE = "infrastructure"  # retry.infrastructure, backing off
    PREEMPTION = "preemption"  # retry.preemption, a fixed delay; spot then on-demand


@dataclass(frozen=True)
class ClassRules:
    """Everything avsim does with one class, in one row (:data:`CLASS_RULES`)."""

    #: Downstream phases consume the attempt's output: it is committed as the phase's result.
    produced_output: bool
    #: The attempt is evidence of a bad build (canary gate, circuit breaker).
    counts_against_build: bool
    #: The retry budget a failure of this class spends.
    budget: Budget
    #: The class's place in the precedence of case classes (:data:`CASE_PRECEDENCE`, lowest first);
    #: None: no case takes it (it is not an attempt's ending).
    case_rank: int | None
    #: Its place where failures are listed (:data:`FAILURE_ORDER`); None: a result, never listed.
    listing_rank: int | None
    #: The kind of exception a phase task raises for it (:class:`avsim.phases.policy.Failure`'s value,
    #: when no detail names it more precisely); "" for a result.
    fails_as: str
    #: Its colour in the report and on the pages ("" when it is never shown as a case's class).
    colour: str = ""
    #: Classes of phases that never ran which give a case this class (besides this class itself).
    given_by: tuple[str, ...] = ()


#: A phase of a case that never ran because the case stopped before it (not an attempt's class).
NOT_RUN = "not_run"

#: The one table of what each class means. Precedence of case classes (``case_rank``): a case takes
#: the first class one of its phases gives (:func:`case_class`), the most specific reason first: bad
#: input, a bad build, an exhausted preemption budget, any other infrastructure failure (a phase that
#: never ran included), a failed scenario; else passed. Listing order (``listing_rank``): what needs
#: an engineer first (a bad build stops the week), a failed scenario last.
CLASS_RULES: dict[Outcome, ClassRules] = {
    Outcome.PASSED: ClassRules(
        produced_output=True, counts_against_build=False, budget=Budget.NONE,
        case_rank=5, listing_rank=None, fails_as="", colour="#1c7c3c",
    ),
    Outcome.SCENARIO_FAILED: ClassRules(
        produced_output=True, counts_against_build=False, budget=Budget.NONE,
        case_rank=4, listing_rank=4, fails_as="", colour="#b35c00",
    ),
    Outcome.BAD_INPUT: ClassRules(
        produced_output=False, counts_against_build=False, budget=Budget.NONE,
        case_rank=0, listing_rank=1, fails_as="bad_input", colour="#a1127b",
    ),
    Outcome.INFRA_FAILED: ClassRules(
        produced_output=False, counts_against_build=True, budget=Budget.INFRASTRUCTURE,
        case_rank=3, listing_rank=2, fails_as="infrastructure", colour="#c0262d",
        given_by=(NOT_RUN, "upstream_failed"),
    ),
    Outcome.PREEMPTED: ClassRules(
        produced_output=False, counts_against_build=False, budget=Budget.PREEMPTION,
        case_rank=2, listing_rank=3, fails_as="preempted", colour="#6a4fb3",
    ),
    Outcome.BAD_BUILD: ClassRules(
        produced_output=False, counts_against_build=True, budget=Budget.NONE,
        case_rank=1, listing_rank=0, fails_as="bad_build", colour="#5b2a0e",
    ),
    Outcome.UPSTREAM_FAILED: ClassRules(
        produced_output=False, counts_against_build=False, budget=Budget.NONE,
        case_rank=None, listing_rank=None, fails_as="bad_input",
    ),
}  # fmt: skip

#: Every class an attempt can end in, in the order counts, legends and tables list them: results
#: first (the members' order).
ENDED: tuple[Outcome, ...] = tuple(o for o in Outcome if o.rules.case_rank is not None)
#: The regression run's results: classes that never need an engineer.
RESULTS: frozenset[Outcome] = frozenset(o for o in ENDED if o.produced_output)
#: The one precedence of case classes (``case_rank``). The ledger's shard summaries, the verdict,
#: the report and the page (whose SQL is generated from it, :mod:`avsim.ui.progress`) all class
#: cases by it.
CASE_PRECEDENCE: tuple[Outcome, ...] = tuple(sorted(ENDED, key=lambda o: o.rules.case_rank or 0))
#: The phase classes that give a case each class of :data:`CASE_PRECEDENCE`, in the order the
#: phase that gave it is looked for: a phase that never ran (not run, upstream failed) makes its
#: case an infrastructure failure, and a failed phase beats the phases it stopped.
PHASES_GIVING: dict[Outcome, tuple[str, ...]] = {c: (c.value, *c.rules.given_by) for c in CASE_PRECEDENCE}


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
#: failed phases; ``listing_rank``). A listing order only: the class a case takes is :func:`case_class`'s.
FAILURE_ORDER: tuple[Outcome, ...] = tuple(
    sorted((o for o in ENDED if o.rules.listing_rank is not None), key=lambda o: o.rules.listing_rank or 0)
)
#: Each class's colour, by its serialized name (the report's plots and pages take theirs from here).
CLASS_COLOURS: dict[str, str] = {o.value: o.rules.colour for o in ENDED}


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
    #: The artifact store did not answer while the attempt's outputs were checked: the store's failure,
    #: not the build's (:func:`is_build_evidence`).
    STORAGE_UNAVAILABLE = "storage_unavailable"


#: Details that say the platform lost the attempt before the build's process could tell anything: its
#: worker, its pod or node, the Kubernetes API, the artifact store, or no node to start on.
PLATFORM_LOSSES: frozenset[str] = frozenset(
    {
        Detail.ABANDONED,
        Detail.WORKER_LOST,
        Detail.VANISHED,
        Detail.WATCH_ERROR,
        Detail.NODE_LOST,
        Detail.SPAWN,
        Detail.STARTUP_TIMEOUT,
        Detail.STORAGE_UNAVAILABLE,
    }
)


def says_nothing_of_build(outcome: Outcome | None, detail: str = "") -> bool:
    """Whether an attempt that ended ``outcome``/``detail`` is neither a failure nor a success of its
    build: preempted, or lost by the platform (:data:`PLATFORM_LOSSES`). The canary gate looks at the
    phase's next attempt instead, and the circuit breaker leaves it out of its window."""
    return outcome is Outcome.PREEMPTED or detail in PLATFORM_LOSSES


def is_build_evidence(outcome: Outcome | None, detail: str = "") -> bool:
    """Whether an attempt that ended ``outcome``/``detail`` is evidence of a bad build (the canary gate,
    the circuit breaker): its class counts against the build, and the platform did not lose it."""
    return outcome is not None and outcome.counts_against_build and detail not in PLATFORM_LOSSES


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
