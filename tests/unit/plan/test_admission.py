"""Admission by cases in flight, the pure rules (avsim.plan.admission): the shard size a week is cut into,
how many cases each shard holds, whether a shard may start now, and the week's target from the pools."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest

from avsim.contracts import AdmissionPlan, RunDescriptor
from avsim.errors import AvsimError
from avsim.manifest.models import Manifest
from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.plan.admission import (
    MAX_SHARD_RUNS,
    AdmissionVerdict,
    InFlight,
    admission_plan,
    admission_shard_size,
    admit,
    shard_case_count,
    week_target,
)
from avsim.plan.build import build_plan
from avsim.plan.catalog import load_catalog
from avsim.plan.inflight import CaseLoad, Pools, binding_pool, target_cases_in_flight
from avsim.plan.shards import assign_families, cut_shards
from avsim.planner.workload import workload_from_manifest
from avsim.settings import AvsimSettings

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "dags" / "avsim_graphs.yaml"


@cache
def _manifest(cases: int) -> Manifest:
    return validate_manifest(sample_manifest(cases))


@cache
def _load() -> CaseLoad:
    """The sample week's mean case, as ``prepare`` derives it (GPU-bound at these pools)."""
    return workload_from_manifest(_manifest(400)).case_load()


# --- admission_shard_size ---------------------------------------------------------------------------


def test_shard_size_is_a_third_of_the_target_capped_by_the_largest() -> None:
    """About a third (SHARD_SHARE, 0.36: the planner's best at the sample week's target of 702)."""
    assert admission_shard_size(10_000, target=702, largest=300) == 252
    assert admission_shard_size(10_000, target=702, largest=250) == 250
    assert admission_shard_size(10_000, target=300, largest=250) == 108
    # A third of a large target is above [avsim] shard_size: the configured size caps it.
    assert admission_shard_size(10_000, target=3_000, largest=250) == 250
    assert admission_shard_size(10_000, target=702, largest=50) == 50


def test_shard_size_is_raised_to_keep_the_week_within_max_shard_runs() -> None:
    # A third of 30 is 10 (0.36 x 30): 20,000 cases would be 2,000 shard runs. Raised so there are at most 200.
    size = admission_shard_size(20_000, target=30, largest=250)
    assert size == 100
    assert -(-20_000 // size) == MAX_SHARD_RUNS
    # One case more needs one more per shard run.
    assert admission_shard_size(20_001, target=30, largest=250) == 101
    # ... but never above the largest (a family group of a shard must still expand): more runs then.
    assert admission_shard_size(100_000, target=30, largest=250) == 250


def test_shard_size_is_never_below_one() -> None:
    assert admission_shard_size(10, target=1, largest=250) == 1
    assert admission_shard_size(10, target=2, largest=250) == 1
    assert admission_shard_size(0, target=1, largest=1) == 1
    assert admission_shard_size(0, target=900, largest=250) == 250


@pytest.mark.parametrize(
    ("cases", "target", "largest"), [(-1, 10, 10), (10, 0, 10), (10, 10, 0), (10, -5, 10)]
)
def test_shard_size_refuses_bad_figures(cases: int, target: int, largest: int) -> None:
    with pytest.raises(AvsimError, match="bad figures"):
        admission_shard_size(cases, target, largest)


# --- shard_case_count -------------------------------------------------------------------------------


def test_shard_case_count_last_shard_short_and_past_the_end_empty() -> None:
    assert [shard_case_count(k, 23, 10) for k in (1, 2, 3, 4)] == [10, 10, 3, 0]
    assert [shard_case_count(k, 20, 10) for k in (1, 2, 3)] == [10, 10, 0]
    assert shard_case_count(0, 23, 10) == 0  # shards are numbered from 1
    assert shard_case_count(1, 23, 0) == 0
    assert shard_case_count(1, 0, 10) == 0


@pytest.mark.parametrize(
    ("cases", "size", "canary"),
    [(130, 40, []), (130, 7, [0, 5, 129]), (97, 1, [3]), (60, 60, []), (61, 60, [])],
)
def test_shard_case_count_agrees_with_cut_shards(cases: int, size: int, canary: list[int]) -> None:
    """What admission counts for shard k is what ``prepare`` wrote into shard k's case file."""
    manifest = _manifest(cases)
    families = assign_families(manifest, build_plan(load_catalog(CATALOG), AvsimSettings(shard_size=size)))
    _, shards = cut_shards(manifest, families, size, canary)
    rest = cases - len(canary)
    assert [s.index for s in shards] == list(range(1, len(shards) + 1))
    assert [shard_case_count(s.index, rest, size) for s in shards] == [s.case_count for s in shards]
    assert shard_case_count(len(shards) + 1, rest, size) == 0


# --- admit ------------------------------------------------------------------------------------------


def test_the_shards_before_it_take_their_room_first_and_all_that_fit_start_together() -> None:
    """Shards 3 and 4 (10 cases each) have not started; shard 5 asks. Their cases count as started:
    with 0 in flight and a target of 1,000 all three fit and start in the same count. With 15 in flight
    and a target of 30, shard 3 fits (15 < 30), shard 4 too (25 < 30), shard 5 not (35): it waits its
    turn; with 30 in flight nothing fits and it waits for room."""
    ahead = InFlight(admitted_cases=0, finished_cases=0, earlier_waiting=3, earlier_waiting_cases=20)
    decision = admit(5, 10, ahead, target=1_000)
    assert decision.admitted and "after the 20 of the shards before it" in decision.reason
    busy = InFlight(admitted_cases=15, finished_cases=0, earlier_waiting=3, earlier_waiting_cases=20)
    assert admit(3, 10, InFlight(15, 0), target=30).admitted
    assert admit(4, 10, InFlight(15, 0, earlier_waiting=3, earlier_waiting_cases=10), target=30).admitted
    decision = admit(5, 10, busy, target=30)
    assert decision.verdict is AdmissionVerdict.WAIT_TURN and not decision.admitted
    assert "shard 3" in decision.reason and "20 to start before this shard" in decision.reason
    full = InFlight(admitted_cases=30, finished_cases=0, earlier_waiting=3, earlier_waiting_cases=20)
    assert admit(5, 10, full, target=30).verdict is AdmissionVerdict.WAIT_ROOM


def test_an_empty_week_admits_a_shard_larger_than_the_target() -> None:
    decision = admit(1, 250, InFlight(admitted_cases=0, finished_cases=0), target=100)
    assert decision.verdict is AdmissionVerdict.ADMIT and decision.admitted
    # All admitted cases finished: nothing in flight, the next one starts whatever its size.
    assert admit(2, 250, InFlight(admitted_cases=250, finished_cases=250), target=100).admitted


def test_a_shard_refills_the_target_as_soon_as_a_case_ends() -> None:
    """The target is a floor while cases wait: one free place admits a whole shard run, so the week
    never sinks a shard run's size below it between starts (it peaks at target + size - 1)."""
    # 99 unfinished < 100: starts, its 40 cases take the week to 139.
    below = admit(3, 40, InFlight(admitted_cases=120, finished_cases=21), target=100)
    assert below.verdict is AdmissionVerdict.ADMIT and "99 cases in flight < target 100" in below.reason
    # 100 unfinished: waits for one case to finish.
    at = admit(3, 40, InFlight(admitted_cases=120, finished_cases=20), target=100)
    assert at.verdict is AdmissionVerdict.WAIT_ROOM and not at.admitted
    assert "waiting for 1 to finish" in at.reason


def test_unfinished_never_negative() -> None:
    # More ends than cases (a count read mid-repair) reads as nothing in flight.
    assert InFlight(admitted_cases=10, finished_cases=12).unfinished_cases == 0


# --- admission_plan / week_target -------------------------------------------------------------------


def test_configured_target_wins_over_the_pools() -> None:
    plan = admission_plan(_load(), spot_gpus=280, cpus=200, configured=77, fallback=1_500)
    assert plan.target == 77 and plan.configured == 77
    assert week_target(plan, 10, 10) == 77
    assert week_target(plan, None, None) == 77


def test_derived_target_is_the_planners_target_for_the_same_load_and_pools() -> None:
    load = _load()
    for gpus, cpus in [(10, 200), (40, 200), (280, 200), (280, 20)]:
        plan = admission_plan(load, spot_gpus=gpus, cpus=cpus, configured=0, fallback=1_500)
        assert plan.target == target_cases_in_flight(load, Pools(spot_gpus=gpus, cpus=cpus))
        assert (plan.spot_gpus, plan.cpus) == (gpus, cpus)
        # The shards task derives it again from the same pools: the same target.
        assert week_target(plan, gpus, cpus) == plan.target


def test_raising_the_spot_pool_raises_the_target() -> None:
    """The deadline tracker raises the spot GPU pool mid-week: a waiting shard reads the pools again
    and admits more cases in flight than the week was prepared with."""
    load = _load()
    plan = admission_plan(load, spot_gpus=20, cpus=200, configured=0, fallback=1_500)
    assert binding_pool(load, Pools(spot_gpus=20, cpus=200)) == "GPU"
    raised = week_target(plan, 40, 200)
    assert raised > plan.target
    assert raised == target_cases_in_flight(load, Pools(spot_gpus=40, cpus=200))


def test_unknown_or_empty_pools_fall_back_to_the_prepared_target() -> None:
    load = _load()
    # Slots unknown when prepared: the fallback (the window's W x S).
    unknown = admission_plan(load, spot_gpus=None, cpus=None, configured=0, fallback=1_500)
    assert unknown.target == 1_500
    # A pool with no slots cannot pace the cases: the fallback too.
    empty = admission_plan(load, spot_gpus=0, cpus=200, configured=0, fallback=1_500)
    assert empty.target == 1_500
    assert admission_plan(load, spot_gpus=280, cpus=0, configured=0, fallback=1_500).target == 1_500
    assert admission_plan(load, spot_gpus=None, cpus=None, configured=0, fallback=0).target == 1
    # At run time: the pools cannot be read, or one was emptied: the prepared target holds.
    prepared = admission_plan(load, spot_gpus=20, cpus=200, configured=0, fallback=1_500)
    assert week_target(prepared, None, None) == prepared.target
    assert week_target(prepared, 20, None) == prepared.target
    assert week_target(prepared, 0, 200) == prepared.target
    # A plan without the mean case (hand-written, or damaged) keeps its target too.
    bare = AdmissionPlan(target=42)
    assert week_target(bare, 280, 200) == 42
    partial = prepared.model_copy(update={"load": {"cases": 10.0}})
    assert week_target(partial, 280, 200) == prepared.target


def test_admission_plan_round_trips_through_the_run_descriptor() -> None:
    plan = admission_plan(_load(), spot_gpus=20, cpus=200, configured=0, fallback=1_500)
    assert set(plan.load) == {f.name for f in dataclasses.fields(CaseLoad)}
    run = RunDescriptor(
        run_key="avsim_weekly__r1",
        artifact_root="file:///tmp/x",
        case_count=400,
        shard_count=6,
        shard_size=plan.target // 3,
        admission=plan,
    )
    again = RunDescriptor.model_validate_json(run.model_dump_json())
    assert again == run and again.admission == plan
    assert RunDescriptor.model_validate(run.to_json()) == run
    assert again.admission is not None
    # The load survives as the figures it was: the target derived again from it is the same.
    assert week_target(again.admission, 40, 200) == week_target(plan, 40, 200) > plan.target


def test_a_descriptor_from_before_admission_still_parses() -> None:
    old = {
        "run_key": "avsim_weekly__r1",
        "artifact_root": "file:///tmp/x",
        "dag_id": "avsim_weekly",
        "run_id": "r1",
        "case_count": 24,
        "shard_count": 2,
        "canary_count": 5,
    }
    run = RunDescriptor.model_validate(old)
    assert run.shard_size == 0 and run.admission is None
    with pytest.raises(ValueError):
        AdmissionPlan.model_validate({"target": 0})
    with pytest.raises(ValueError):
        AdmissionPlan.model_validate({"target": 5, "unknown": 1})
