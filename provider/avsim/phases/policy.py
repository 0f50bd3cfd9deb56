"""The failure policy: what avsim does when a phase attempt ends, decided in one place.

:func:`decide` takes the task's attempts in its current round, how the new one ended, the phase's retry
rules and the task's role, and returns a :class:`Decision` (commit, fail fast, retry, give up or hand
over to the on-demand twin) naming the :class:`Failure` kind to raise; :func:`admit` judges the same
before a launch. Nothing here imports Airflow. docs/design.md, "One failure policy" and "Retry classes
and budgets" (the budgets of each role).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, Budget, Detail, Outcome

__all__ = [
    "Action",
    "Budgets",
    "Decision",
    "Failure",
    "RetryRules",
    "Role",
    "admit",
    "budgets",
    "decide",
    "failure_for",
    "node_class_for",
    "preemption_budget",
    "retry_delay",
    "task_retries",
]


class Role(str, Enum):
    """A phase task's role: a phase without an on-demand twin, a GPU phase's spot task, its twin."""

    REGULAR = "regular"
    SPOT = "spot"
    ON_DEMAND = "on_demand"


class Action(str, Enum):
    """What the phase task does next."""

    #: Launch the next attempt (:func:`admit` only).
    LAUNCH = "launch"
    #: Commit the attempt's result (passed, or the scenario failed); downstream phases run.
    COMMIT = "commit"
    #: Commit the failure and end the phase at once, no retry (bad input, bad build).
    FAIL_FAST = "fail_fast"
    #: Retry after ``delay_seconds``, on ``next_node``.
    RETRY = "retry"
    #: The class's budget (or Airflow's last try) is used up: commit the failure, end the phase.
    EXHAUSTED = "exhausted"
    #: Preempted ``on_demand_after_preemptions`` times on spot: the on-demand twin runs next.
    HAND_OVER = "hand_over"

    @property
    def ends_phase(self) -> bool:
        """Whether the phase's committed outcome is final after this action."""
        return self in (Action.COMMIT, Action.FAIL_FAST, Action.EXHAUSTED)


class Failure(str, Enum):
    """The kind of exception a phase task raises for a decision (one class each, see
    :data:`avsim.operators.exceptions.FAILURE_EXCEPTIONS`)."""

    BAD_INPUT = "bad_input"
    BAD_BUILD = "bad_build"
    IMAGE_PULL = "image_pull"
    BREAKER_OPEN = "breaker_open"
    BUDGET_EXHAUSTED = "budget_exhausted"
    HAND_OVER = "hand_over"
    INFRASTRUCTURE = "infrastructure"
    OUT_OF_MEMORY = "out_of_memory"
    LEASE_EXPIRED = "lease_expired"
    #: An infrastructure failure: the pod vanished or its (non-spot) node was lost.
    POD_LOST = "pod_lost"
    PREEMPTED = "preempted"
    EVICTED = "evicted"
    #: A preemption: the spot pod vanished or its node was lost.
    NODE_RECLAIMED = "node_reclaimed"


class RetryRules(Protocol):
    """A phase's retry rules (the manifest's ``RetrySpec`` has these fields)."""

    @property
    def infrastructure(self) -> int: ...
    @property
    def delay_seconds(self) -> float: ...
    @property
    def backoff(self) -> float: ...
    @property
    def max_delay_seconds(self) -> float: ...
    @property
    def preemption(self) -> int: ...
    @property
    def preemption_delay_seconds(self) -> float: ...
    @property
    def on_demand_after_preemptions(self) -> int: ...


@dataclass(frozen=True)
class Budgets:
    """Failures of each retriable class one phase task of a role may absorb."""

    infrastructure: int
    preemption: int
    #: Preemptions after which a spot task hands over (None: this task never hands over).
    hand_over_after: int | None = None

    def of(self, outcome: Outcome) -> int:
        """The budget of ``outcome``'s kind (:attr:`avsim.phases.contract.ClassRules.budget`)."""
        kind = outcome.rules.budget
        if kind is Budget.INFRASTRUCTURE:
            return self.infrastructure
        if kind is Budget.PREEMPTION:
            return self.preemption
        return 0

    @property
    def retries(self) -> int:
        """Airflow ``retries`` of the task: every failure its budgets allow, so Airflow never stops
        a phase before its class budget is used up."""
        return self.infrastructure + self.preemption


def preemption_budget(role: Role, preemption: int, on_demand_after: int) -> int:
    """Preemptions a task of ``role`` may absorb (a spot task hands over after ``on_demand_after``)."""
    if role is Role.SPOT:
        return min(preemption, on_demand_after)
    if role is Role.ON_DEMAND:
        return max(0, preemption - on_demand_after)
    return preemption


def budgets(retry: RetryRules, role: Role) -> Budgets:
    """The budgets of a phase task of ``role`` under ``retry``."""
    after = retry.on_demand_after_preemptions
    hands_over = role is Role.SPOT and retry.preemption > 0
    return Budgets(
        infrastructure=retry.infrastructure,
        preemption=preemption_budget(role, retry.preemption, after),
        hand_over_after=after if hands_over else None,
    )


def task_retries(role: Role, infrastructure: int, preemption: int, on_demand_after: int) -> int:
    """Airflow ``retries`` of a phase task of ``role`` (see :attr:`Budgets.retries`)."""
    return infrastructure + preemption_budget(role, preemption, on_demand_after)


def retry_delay(outcome: Outcome, failures_so_far: int, retry: RetryRules) -> float:
    """Seconds before the retry after the ``failures_so_far``-th failure of ``outcome``: a preemption
    retries after its fixed delay (the capacity is gone, not broken), an infrastructure failure
    backs off exponentially up to ``max_delay_seconds``."""
    if outcome.rules.budget is Budget.PREEMPTION:
        return float(retry.preemption_delay_seconds)
    if outcome.rules.budget is not Budget.INFRASTRUCTURE:
        raise ValueError(f"{outcome.value} is never retried")
    n = max(1, failures_so_far)
    return float(min(retry.max_delay_seconds, retry.delay_seconds * retry.backoff ** (n - 1)))


def node_class_for(gpus: int, role: Role) -> str:
    """Where an attempt of a task of ``role`` runs: CPU nodes, on-demand GPUs (the twin) or spot GPUs."""
    if not gpus:
        return NODE_CPU
    return NODE_ON_DEMAND if role is Role.ON_DEMAND else NODE_SPOT


#: (outcome, detail) -> the exception kind; an outcome's own kind when its detail is not listed.
_BY_DETAIL: dict[tuple[Outcome, str], Failure] = {
    (Outcome.BAD_BUILD, Detail.IMAGE_PULL): Failure.IMAGE_PULL,
    (Outcome.BAD_BUILD, Detail.BREAKER_OPEN): Failure.BREAKER_OPEN,
    (Outcome.INFRA_FAILED, Detail.OOM): Failure.OUT_OF_MEMORY,
    (Outcome.INFRA_FAILED, Detail.LEASE_EXPIRED): Failure.LEASE_EXPIRED,
    (Outcome.INFRA_FAILED, Detail.VANISHED): Failure.POD_LOST,
    (Outcome.INFRA_FAILED, Detail.NODE_LOST): Failure.POD_LOST,
    (Outcome.PREEMPTED, Detail.EVICTED): Failure.EVICTED,
    (Outcome.PREEMPTED, Detail.VANISHED): Failure.NODE_RECLAIMED,
    (Outcome.PREEMPTED, Detail.NODE_LOST): Failure.NODE_RECLAIMED,
}
#: Each failure class's own kind, from its row of the class table.
_BY_OUTCOME: dict[Outcome, Failure] = {o: Failure(o.rules.fails_as) for o in Outcome if not o.produced_output}


def failure_for(outcome: Outcome, detail: str = "") -> Failure:
    """The exception kind of an attempt that ended with ``outcome`` and ``detail``. The outcome
    decides (a vanished CPU pod is an infrastructure failure, a vanished spot pod a preemption);
    the detail only names it more precisely within its outcome."""
    if outcome.produced_output:
        raise ValueError(f"{outcome.value} is a result, not a failure")
    return _BY_DETAIL.get((outcome, detail), _BY_OUTCOME[outcome])


@dataclass(frozen=True)
class Decision:
    """What to do after an attempt (or before a launch)."""

    action: Action
    outcome: Outcome
    #: The exception kind to raise (None when the task commits a result or launches).
    failure: Failure | None = None
    #: Failures of ``outcome``'s class in the task's round, this attempt included, and its budget.
    used: int = 0
    budget: int = 0
    #: Seconds before the retry (``retry`` only).
    delay_seconds: float = 0.0
    #: Where the next attempt runs (``retry``, ``hand_over``, ``launch``); "" when there is none.
    next_node: str = ""

    def describe(self) -> str:
        """The decision in words, for a task's log and its exception."""
        cls = self.outcome.value
        if self.action is Action.RETRY:
            return f"{self.used} of {self.budget} {cls} retries used; next try in {self.delay_seconds:g}s"
        if self.action is Action.HAND_OVER:
            return (
                f"preempted {self.used} times on spot nodes: the next attempt runs on {self.next_node} nodes"
            )
        if self.action is Action.EXHAUSTED:
            return f"{self.used} {cls} attempts with a budget of {self.budget} retries; no retries left"
        return self.action.value


def _count(history: Iterable[Outcome], outcome: Outcome) -> int:
    """Failures in ``history`` that spent ``outcome``'s budget (classes sharing a budget count together)."""
    kind = outcome.rules.budget
    return sum(1 for h in history if h.rules.budget is kind)


def admit(history: Sequence[Outcome], retry: RetryRules, role: Role, *, gpus: int = 0) -> Decision:
    """Whether the task may launch another attempt, given its round's ended attempts (which may
    include a lost worker's attempts, recorded as infrastructure failures by the next try)."""
    b = budgets(retry, role)
    # Each budget kind in turn (infrastructure first), a failure of that kind standing for it.
    spent = {h.rules.budget: h for h in history if h.retriable}
    for outcome in (spent[kind] for kind in Budget if kind in spent):
        used = _count(history, outcome)
        if used > b.of(outcome):
            return Decision(Action.EXHAUSTED, outcome, Failure.BUDGET_EXHAUSTED, used, b.of(outcome))
    return Decision(Action.LAUNCH, Outcome.PASSED, next_node=node_class_for(gpus, role))


def decide(
    history: Sequence[Outcome],
    outcome: Outcome,
    retry: RetryRules,
    role: Role,
    *,
    detail: str = "",
    gpus: int = 0,
    last_try: bool = False,
) -> Decision:
    """What the task does after an attempt that ended with ``outcome``.

    ``history``: the outcomes of the task's earlier ended attempts in its current round (this one
    not included). ``last_try``: Airflow will not run the task again (its ``max_tries`` is reached).
    """
    if outcome.produced_output:
        return Decision(Action.COMMIT, outcome)
    failure = failure_for(outcome, detail)
    if not outcome.retriable:
        return Decision(Action.FAIL_FAST, outcome, failure)
    b = budgets(retry, role)
    used = _count(history, outcome) + 1
    budget = b.of(outcome)
    if (
        outcome.rules.budget is Budget.PREEMPTION
        and b.hand_over_after is not None
        and used >= b.hand_over_after
    ):
        return Decision(
            Action.HAND_OVER,
            outcome,
            Failure.HAND_OVER,
            used,
            budget,
            next_node=node_class_for(gpus or 1, Role.ON_DEMAND),
        )
    if used > budget or last_try:
        return Decision(Action.EXHAUSTED, outcome, Failure.BUDGET_EXHAUSTED, used, budget)
    return Decision(
        Action.RETRY,
        outcome,
        failure,
        used,
        budget,
        delay_seconds=retry_delay(outcome, used, retry),
        next_node=node_class_for(gpus, role),
    )
