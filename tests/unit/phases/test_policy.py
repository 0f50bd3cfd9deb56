"""The failure policy (:mod:`avsim.phases.policy`) as a table and as properties: every class x budget
state x placement, then invariants over random attempt histories and retry rules. No Airflow."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from avsim.manifest.models import RetrySpec
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, Outcome
from avsim.phases.policy import (
    Action,
    Failure,
    Role,
    admit,
    budgets,
    decide,
    failure_for,
    node_class_for,
    retry_delay,
    task_retries,
)

INFRA, PRE = Outcome.INFRA_FAILED, Outcome.PREEMPTED
#: 2 infrastructure retries (delays 10, 30, capped at 60), 3 preemption retries (5 s each), the
#: on-demand twin after 2 preemptions on spot.
RULES = RetrySpec(
    infrastructure=2,
    delay_seconds=10,
    backoff=3,
    max_delay_seconds=60,
    preemption=3,
    preemption_delay_seconds=5,
    on_demand_after_preemptions=2,
)
#: A GPU phase's spot task and its twin run on GPUs; a regular task here is a CPU phase.
GPUS = {Role.REGULAR: 0, Role.SPOT: 1, Role.ON_DEMAND: 1}
NODE = {Role.REGULAR: NODE_CPU, Role.SPOT: NODE_SPOT, Role.ON_DEMAND: NODE_ON_DEMAND}

# (outcome, role, earlier failures of the same class) -> (action, used, budget, delay)
RETRIABLE_TABLE = [
    # infrastructure: budget 2 for every role, exponential backoff
    (INFRA, Role.REGULAR, 0, Action.RETRY, 1, 2, 10.0),
    (INFRA, Role.REGULAR, 1, Action.RETRY, 2, 2, 30.0),
    (INFRA, Role.REGULAR, 2, Action.EXHAUSTED, 3, 2, 0.0),
    (INFRA, Role.SPOT, 0, Action.RETRY, 1, 2, 10.0),
    (INFRA, Role.SPOT, 1, Action.RETRY, 2, 2, 30.0),
    (INFRA, Role.SPOT, 2, Action.EXHAUSTED, 3, 2, 0.0),
    (INFRA, Role.ON_DEMAND, 0, Action.RETRY, 1, 2, 10.0),
    (INFRA, Role.ON_DEMAND, 1, Action.RETRY, 2, 2, 30.0),
    (INFRA, Role.ON_DEMAND, 2, Action.EXHAUSTED, 3, 2, 0.0),
    # preemption: regular keeps all 3; spot hands over at the 2nd; the twin has the 1 left
    (PRE, Role.REGULAR, 0, Action.RETRY, 1, 3, 5.0),
    (PRE, Role.REGULAR, 2, Action.RETRY, 3, 3, 5.0),
    (PRE, Role.REGULAR, 3, Action.EXHAUSTED, 4, 3, 0.0),
    (PRE, Role.SPOT, 0, Action.RETRY, 1, 2, 5.0),
    (PRE, Role.SPOT, 1, Action.HAND_OVER, 2, 2, 0.0),
    (PRE, Role.ON_DEMAND, 0, Action.RETRY, 1, 1, 5.0),
    (PRE, Role.ON_DEMAND, 1, Action.EXHAUSTED, 2, 1, 0.0),
]


@pytest.mark.parametrize(("outcome", "role", "earlier", "action", "used", "budget", "delay"), RETRIABLE_TABLE)
def test_retriable_classes_by_budget_state_and_placement(
    outcome: Outcome, role: Role, earlier: int, action: Action, used: int, budget: int, delay: float
) -> None:
    other = PRE if outcome is INFRA else INFRA
    history = [outcome] * earlier + [other]  # a failure of the other class never counts against this one
    d = decide(history, outcome, RULES, role, gpus=GPUS[role])
    assert (d.action, d.used, d.budget, d.delay_seconds) == (action, used, budget, delay)
    if action is Action.RETRY:
        assert d.next_node == NODE[role] and d.failure is failure_for(outcome)
    elif action is Action.HAND_OVER:
        assert d.next_node == NODE_ON_DEMAND and d.failure is Failure.HAND_OVER
    else:
        assert d.next_node == "" and d.failure is Failure.BUDGET_EXHAUSTED
    # Airflow's last try ends the phase whatever the budgets say (a hand-over still happens: the
    # twin is another task, with tries of its own).
    last = decide(history, outcome, RULES, role, gpus=GPUS[role], last_try=True)
    assert last.action is (Action.HAND_OVER if action is Action.HAND_OVER else Action.EXHAUSTED)


def test_every_class_and_role_is_in_the_table() -> None:
    covered = {(o, r) for o, r, *_ in RETRIABLE_TABLE}
    assert covered == {(o, r) for o in Outcome if o.retriable for r in Role}
    states = {(o, r): {a for o2, r2, _, a, *_ in RETRIABLE_TABLE if (o2, r2) == (o, r)} for o, r in covered}
    for (o, r), actions in states.items():  # each reaches its end: exhausted, or the twin takes over
        assert Action.RETRY in actions and actions & {Action.EXHAUSTED, Action.HAND_OVER}, (o, r)


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize(
    ("outcome", "detail", "action", "failure"),
    [
        (Outcome.PASSED, "", Action.COMMIT, None),
        (Outcome.SCENARIO_FAILED, "", Action.COMMIT, None),
        (Outcome.BAD_INPUT, "", Action.FAIL_FAST, Failure.BAD_INPUT),
        (Outcome.BAD_BUILD, "", Action.FAIL_FAST, Failure.BAD_BUILD),
        (Outcome.BAD_BUILD, "image_pull", Action.FAIL_FAST, Failure.IMAGE_PULL),
        (Outcome.BAD_BUILD, "breaker_open", Action.FAIL_FAST, Failure.BREAKER_OPEN),
        (Outcome.UPSTREAM_FAILED, "", Action.FAIL_FAST, Failure.BAD_INPUT),
    ],
)
def test_results_and_fail_fast_classes_ignore_budgets(
    role: Role, outcome: Outcome, detail: str, action: Action, failure: Failure | None
) -> None:
    for history in ([], [INFRA, INFRA, INFRA], [PRE] * 5):
        for last_try in (False, True):
            d = decide(history, outcome, RULES, role, detail=detail, gpus=GPUS[role], last_try=last_try)
            assert (d.action, d.failure, d.delay_seconds) == (action, failure, 0.0)
            assert d.action.ends_phase


def test_the_outcome_decides_the_exception_and_the_detail_refines_it() -> None:
    # A vanished or lost CPU/on-demand pod is an infrastructure failure, a vanished spot pod a preemption.
    assert failure_for(INFRA, "vanished") is Failure.POD_LOST
    assert failure_for(INFRA, "node_lost") is Failure.POD_LOST
    assert failure_for(PRE, "vanished") is Failure.NODE_RECLAIMED
    assert failure_for(PRE, "node_lost") is Failure.NODE_RECLAIMED
    assert failure_for(INFRA, "oom") is Failure.OUT_OF_MEMORY
    assert failure_for(INFRA, "lease_expired") is Failure.LEASE_EXPIRED
    assert failure_for(PRE, "evicted") is Failure.EVICTED
    assert failure_for(INFRA, "evicted") is Failure.INFRASTRUCTURE  # a detail never crosses classes
    assert failure_for(PRE, "oom") is Failure.PREEMPTED
    with pytest.raises(ValueError, match="result"):
        failure_for(Outcome.PASSED)


def test_every_failure_kind_raises_an_exception_of_its_class() -> None:
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from avsim.operators.exceptions import FAILURE_EXCEPTIONS, PhaseRetriable

    assert set(FAILURE_EXCEPTIONS) == set(Failure)
    for outcome in (INFRA, PRE):
        for detail in ("", "oom", "lease_expired", "vanished", "node_lost", "evicted", "crash"):
            cls = FAILURE_EXCEPTIONS[failure_for(outcome, detail)]
            assert issubclass(cls, PhaseRetriable) and cls.outcome is outcome, (outcome, detail, cls)
    for kind in (Failure.BAD_INPUT, Failure.BAD_BUILD, Failure.IMAGE_PULL, Failure.BREAKER_OPEN):
        assert issubclass(FAILURE_EXCEPTIONS[kind], AirflowFailException)
    assert issubclass(FAILURE_EXCEPTIONS[Failure.BUDGET_EXHAUSTED], AirflowFailException)
    assert issubclass(FAILURE_EXCEPTIONS[Failure.HAND_OVER], AirflowSkipException)


def test_budgets_split_between_spot_task_and_on_demand_twin() -> None:
    assert budgets(RULES, Role.SPOT).preemption == 2 and budgets(RULES, Role.SPOT).hand_over_after == 2
    assert (
        budgets(RULES, Role.ON_DEMAND).preemption == 1
        and budgets(RULES, Role.ON_DEMAND).hand_over_after is None
    )
    assert budgets(RULES, Role.REGULAR).preemption == 3
    assert [task_retries(r, 2, 3, 2) for r in (Role.SPOT, Role.ON_DEMAND, Role.REGULAR)] == [4, 3, 5]
    assert all(budgets(RULES, r).retries == task_retries(r, 2, 3, 2) for r in Role)
    assert [retry_delay(INFRA, n, RULES) for n in (1, 2, 3, 4)] == [10, 30, 60, 60]
    assert [retry_delay(PRE, n, RULES) for n in (1, 2, 3)] == [5, 5, 5]
    with pytest.raises(ValueError, match="never retried"):
        retry_delay(Outcome.BAD_INPUT, 1, RULES)


def test_admit_counts_lost_workers_attempts() -> None:
    assert admit([INFRA, INFRA], RULES, Role.SPOT, gpus=1).action is Action.LAUNCH
    assert admit([INFRA, INFRA], RULES, Role.SPOT, gpus=1).next_node == NODE_SPOT
    over = admit([INFRA, PRE, INFRA, INFRA], RULES, Role.REGULAR)
    assert (over.action, over.outcome, over.used, over.budget) == (Action.EXHAUSTED, INFRA, 3, 2)
    assert node_class_for(0, Role.ON_DEMAND) == NODE_CPU


# -- properties ------------------------------------------------------------------------------------


@st.composite
def retry_rules(draw: st.DrawFn) -> RetrySpec:
    preemption = draw(st.integers(0, 5))
    after = draw(st.integers(1, max(1, preemption)))
    return RetrySpec(
        infrastructure=draw(st.integers(0, 5)),
        delay_seconds=draw(st.integers(0, 100)),
        backoff=draw(st.sampled_from([1.0, 1.5, 2.0, 4.0])),
        max_delay_seconds=draw(st.integers(0, 600)),
        preemption=preemption,
        preemption_delay_seconds=draw(st.integers(0, 100)),
        on_demand_after_preemptions=after,
    )


def _run_phase(
    rules: RetrySpec, endings: list[Outcome], gpus: int
) -> list[tuple[Role, list[Outcome], Action]]:
    """Play ``endings`` through the policy as the operators do: one task per role, each with its own
    round; a hand-over starts the twin. Returns, per task, its role, its attempts and its last action."""
    role = Role.SPOT if gpus and rules.preemption > 0 else Role.REGULAR
    tasks: list[tuple[Role, list[Outcome], Action]] = []
    history: list[Outcome] = []
    tries = 0
    for ending in endings:
        tries += 1
        last_try = tries > task_retries(
            role, rules.infrastructure, rules.preemption, rules.on_demand_after_preemptions
        )
        d = decide(history, ending, rules, role, gpus=gpus, last_try=last_try)
        history.append(ending)
        if d.action is Action.RETRY:
            assert d.delay_seconds >= 0 and d.next_node == node_class_for(gpus, role)
            continue
        tasks.append((role, history, d.action))
        if d.action is not Action.HAND_OVER:
            return tasks
        assert role is Role.SPOT and d.next_node == NODE_ON_DEMAND
        role, history, tries = Role.ON_DEMAND, [], 0
    tasks.append((role, history, Action.LAUNCH))  # still running when the endings ran out
    return tasks


endings_st = st.lists(
    st.sampled_from([INFRA, PRE, INFRA, PRE, Outcome.SCENARIO_FAILED, Outcome.PASSED]), max_size=30
)


@settings(max_examples=400, deadline=None)
@given(rules=retry_rules(), endings=endings_st, gpus=st.sampled_from([0, 1, 4]))
def test_attempts_never_exceed_the_budgets(rules: RetrySpec, endings: list[Outcome], gpus: int) -> None:
    for role, attempts, action in _run_phase(rules, endings, gpus):
        b = budgets(rules, role)
        # Airflow's tries cover every attempt the budgets allow; no class runs past budget + 1.
        assert len(attempts) <= b.retries + 1
        for cls in (INFRA, PRE):
            assert attempts.count(cls) <= b.of(cls) + 1
        if action is Action.EXHAUSTED:
            assert attempts[-1].retriable and attempts.count(attempts[-1]) == b.of(attempts[-1]) + 1


@settings(max_examples=300, deadline=None)
@given(
    rules=retry_rules(),
    history=st.lists(st.sampled_from([INFRA, PRE]), max_size=12),
    role=st.sampled_from(list(Role)),
)
def test_a_scenario_failure_is_never_retried(rules: RetrySpec, history: list[Outcome], role: Role) -> None:
    for last_try in (False, True):
        d = decide(history, Outcome.SCENARIO_FAILED, rules, role, gpus=GPUS[role], last_try=last_try)
        assert d.action is Action.COMMIT and d.action.ends_phase


@settings(max_examples=300, deadline=None)
@given(rules=retry_rules(), endings=st.lists(st.sampled_from([INFRA, PRE, PRE]), max_size=30))
def test_the_hand_over_happens_exactly_at_n_preemptions(rules: RetrySpec, endings: list[Outcome]) -> None:
    tasks = _run_phase(rules, endings, gpus=1)
    spot_role, spot_attempts, spot_action = tasks[0]
    n = rules.on_demand_after_preemptions
    if rules.preemption == 0:
        assert spot_role is Role.REGULAR and all(action is not Action.HAND_OVER for _, _, action in tasks)
        return
    assert spot_role is Role.SPOT
    if spot_action is Action.HAND_OVER:
        assert spot_attempts.count(PRE) == n and spot_attempts[-1] is PRE
        assert tasks[1][0] is Role.ON_DEMAND
    else:  # still going, or its infrastructure budget ran out first: fewer than N preemptions so far
        assert spot_attempts.count(PRE) < n
