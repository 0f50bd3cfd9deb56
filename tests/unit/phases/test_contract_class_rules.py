"""The class table (avsim.phases.contract.CLASS_RULES) is the one place a failure class is described:
every derived order, budget, exception kind and colour comes from it, so a new class is a member and a
row. These check the table is whole and that what is derived from it is what avsim did before it."""

from __future__ import annotations

from avsim.phases import contract, policy
from avsim.phases.contract import CLASS_RULES, Budget, Outcome
from avsim.report.plots import COLOURS


def test_every_class_has_one_row_and_the_ranks_are_a_total_order() -> None:
    assert set(CLASS_RULES) == set(Outcome)
    case_ranks = [r.case_rank for r in CLASS_RULES.values() if r.case_rank is not None]
    listing_ranks = [r.listing_rank for r in CLASS_RULES.values() if r.listing_rank is not None]
    assert sorted(case_ranks) == list(range(len(case_ranks)))
    assert sorted(listing_ranks) == list(range(len(listing_ranks)))
    for outcome, rules in CLASS_RULES.items():
        if rules.produced_output:  # a result: never retried, never raised, never evidence of a bad build
            assert (rules.budget, rules.fails_as, rules.counts_against_build) == (Budget.NONE, "", False)
        else:
            assert policy.failure_for(outcome) is policy.Failure(rules.fails_as)
        if rules.case_rank is not None:  # a class a case can take is shown in its colour
            assert rules.colour.startswith("#") and COLOURS[outcome.value] == rules.colour


def test_the_derived_orders_are_the_ones_avsim_documents() -> None:
    v = contract.values
    assert v(contract.ENDED) == (
        "passed",
        "scenario_failed",
        "bad_input",
        "infra_failed",
        "preempted",
        "bad_build",
    )
    # (CASE_PRECEDENCE's order: tests/unit/test_case_class.py.)
    assert v(contract.FAILURE_ORDER) == (
        "bad_build",
        "bad_input",
        "infra_failed",
        "preempted",
        "scenario_failed",
    )
    assert contract.PHASES_GIVING[Outcome.INFRA_FAILED] == (
        "infra_failed",
        contract.NOT_RUN,
        "upstream_failed",
    )
    assert {o.value for o in Outcome if o.retriable} == {"infra_failed", "preempted"}
    assert {o.value for o in Outcome if o.counts_against_build} == {"infra_failed", "bad_build"}


class _Retry:
    infrastructure, delay_seconds, backoff, max_delay_seconds = 2, 10.0, 2.0, 100.0
    preemption, preemption_delay_seconds, on_demand_after_preemptions = 3, 5.0, 2


def test_the_policy_reads_budgets_and_delays_from_the_table() -> None:
    b = policy.budgets(_Retry(), policy.Role.REGULAR)
    assert (b.of(Outcome.INFRA_FAILED), b.of(Outcome.PREEMPTED), b.of(Outcome.BAD_INPUT)) == (2, 3, 0)
    assert policy.retry_delay(Outcome.INFRA_FAILED, 2, _Retry()) == 20.0
    assert policy.retry_delay(Outcome.PREEMPTED, 2, _Retry()) == 5.0
    spot = policy.decide([Outcome.PREEMPTED], Outcome.PREEMPTED, _Retry(), policy.Role.SPOT, gpus=1)
    assert spot.action is policy.Action.HAND_OVER
    exhausted = policy.admit(
        [Outcome.INFRA_FAILED] * 3 + [Outcome.PREEMPTED] * 4, _Retry(), policy.Role.REGULAR
    )
    assert (exhausted.action, exhausted.outcome) == (policy.Action.EXHAUSTED, Outcome.INFRA_FAILED)


def test_a_platform_loss_says_nothing_of_the_build_and_what_the_build_did_does() -> None:
    """A week of partial faults (tests/integration/test_faults.py) stopped a good build at its canary: a
    storage outage failed 16 canary tasks before they could end their attempts, each next try recorded
    its lost attempt ``abandoned``, and those counted as crashes. An attempt the platform lost (its
    worker, its pod, its node, the store, the API) is skipped like a preemption, never a failure nor a
    success of the build; what the build's own process did still counts."""
    from avsim.phases.contract import Detail, is_build_evidence, says_nothing_of_build

    platform = (
        Detail.ABANDONED,
        Detail.WORKER_LOST,
        Detail.VANISHED,
        Detail.WATCH_ERROR,
        Detail.NODE_LOST,
        Detail.SPAWN,
        Detail.STARTUP_TIMEOUT,
        Detail.STORAGE_UNAVAILABLE,
    )
    for detail in platform:
        assert says_nothing_of_build(Outcome.INFRA_FAILED, detail), detail
        assert not is_build_evidence(Outcome.INFRA_FAILED, detail), detail
    build = (Detail.CRASH, Detail.OOM, Detail.TIMEOUT, Detail.LEASE_EXPIRED, Detail.MISSING_OUTPUT, "")
    for detail in build:
        assert is_build_evidence(Outcome.INFRA_FAILED, detail) and not says_nothing_of_build(
            Outcome.INFRA_FAILED, detail
        ), detail
    assert is_build_evidence(Outcome.BAD_BUILD, Detail.IMAGE_PULL)
    assert says_nothing_of_build(Outcome.PREEMPTED, Detail.EVICTED)
    assert not says_nothing_of_build(Outcome.PASSED, "") and not is_build_evidence(Outcome.PASSED, "")
