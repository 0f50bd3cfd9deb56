"""The critical-path priority rule on its own: bases, path parts, weeks, and the invariants between them."""

from __future__ import annotations

from avsim.manifest.models import RunClass
from avsim.plan.priority_rule import (
    ADHOC_BASE,
    CANARY_BASE,
    EARLIER_WEEK_BASE,
    EARLIER_WEEK_MAX_PATH,
    MAX_PATH_WEIGHT,
    WEEKLY_BASE,
    critical_path_priority,
    is_earlier_week,
    is_rerun,
    path_weight,
    phase_priority,
    priority,
    run_base,
)


def test_the_path_part_never_crosses_a_run_class() -> None:
    # A task whose priority_weight still holds a whole weight (base + path) is clamped, not promoted.
    assert critical_path_priority(ADHOC_BASE, 10_039) == ADHOC_BASE + MAX_PATH_WEIGHT < WEEKLY_BASE
    assert critical_path_priority(WEEKLY_BASE, MAX_PATH_WEIGHT * 3) < CANARY_BASE
    assert critical_path_priority(WEEKLY_BASE, -5) == WEEKLY_BASE
    assert path_weight(1) == 1 and path_weight(61) == 2 and path_weight(10**9) == MAX_PATH_WEIGHT
    assert run_base(RunClass.WEEKLY, "x__canary") == run_base(RunClass.ADHOC, "x__canary") == CANARY_BASE
    assert run_base(RunClass.ADHOC, None) == ADHOC_BASE


def test_an_earlier_weeks_phases_rank_between_this_week_and_adhoc_whatever_their_paths() -> None:
    weekly, adhoc = RunClass.WEEKLY, RunClass.ADHOC
    earlier = [priority(weekly, p, "w__shard_0001", earlier_week=True) for p in (0, 39, 10**6)]
    canary_earlier = [priority(weekly, p, "w__canary", earlier_week=True) for p in (0, 10**6)]
    this_week = priority(weekly, 0, "w__shard_0001")
    adhoc_top = priority(adhoc, 10**6, "a__shard_0001", earlier_week=True)  # ad-hoc runs have no week
    assert adhoc_top == ADHOC_BASE + MAX_PATH_WEIGHT
    assert adhoc_top < min(earlier + canary_earlier) and max(earlier + canary_earlier) < this_week
    assert earlier[0] == EARLIER_WEEK_BASE and earlier[-1] == EARLIER_WEEK_BASE + EARLIER_WEEK_MAX_PATH
    assert earlier[1] == EARLIER_WEEK_BASE + 39  # the path still orders an earlier week's own phases
    # A triage run ranks at the ad-hoc base whatever its week: an earlier week's base never lifts it.
    assert priority(weekly, 39, "w__triage_1_this_1", earlier_week=True) == ADHOC_BASE + 39


def test_which_run_is_an_earlier_week() -> None:
    assert not is_earlier_week("scheduled__2026-12-07", [])
    assert not is_earlier_week("scheduled__2026-12-07", None)  # the database could not say
    assert is_earlier_week("scheduled__2026-12-07", ["scheduled__2026-12-14"])
    # A rerun of failed cases started after this week is not a later week; a rerun is never the current one.
    assert not is_earlier_week("scheduled__2026-12-07", ["rerun__20261209T101500Z"])
    assert is_earlier_week("rerun__20261209T101500Z", [])


def test_a_rerun_is_named_as_the_strategy_recognizes_it() -> None:
    """avsim rerun-failed's run id and the rule's prefix are one convention."""
    import inspect

    from avsim import rerun

    assert 'run_id=f"rerun__{stamp}"' in inspect.getsource(rerun.plan_rerun)
    assert is_rerun("rerun__20261209T101500Z")


def test_the_plans_entry_is_the_rule_with_the_path_of_its_remaining_seconds() -> None:
    assert phase_priority(RunClass.WEEKLY, 39 * 60) == priority(RunClass.WEEKLY, 39) == WEEKLY_BASE + 39
    assert phase_priority(RunClass.ADHOC, 1, "r__canary") == CANARY_BASE + 1
    assert phase_priority(RunClass.WEEKLY, 0, "w__triage_1_last_2") == ADHOC_BASE + 1
