"""The local stack's calibration (``avsim.planner.calibration``): one place that forecasts read.

The forecast must admit a week as its ``prepare`` does: the calibration's scheduler cost is the
shipped ``[avsim] scheduler_ms_per_task_instance``, so the planner's target for a small week on two
GPUs is the cases the scheduler carries comfortably (the whole week), not Little's law's handful.
"""

from __future__ import annotations

import json
from pathlib import Path

from avsim.manifest.sample import sample_manifest
from avsim.manifest.validation import validate_manifest
from avsim.plan.inflight import Pools, comfortable_cases, target_cases_in_flight
from avsim.planner import Capacity, SimOptions
from avsim.planner.calibration import LOCAL_STACK, local_stack_options
from avsim.planner.command import run_plan
from avsim.planner.workload import workload_from_manifest
from avsim.settings import AvsimSettings


def test_the_options_carry_every_figure_of_the_calibration_and_the_changes_asked() -> None:
    opts = local_stack_options(shard_size=7)
    assert opts.phase_overhead_seconds == LOCAL_STACK.phase_overhead_seconds
    assert opts.held_overhead_seconds == LOCAL_STACK.phase_overhead_in_slot_seconds
    assert opts.shard_start_seconds == LOCAL_STACK.shard_start_seconds
    assert opts.run_phases_start_seconds == LOCAL_STACK.run_phases_start_seconds
    assert opts.scheduler_ms_per_task_instance == LOCAL_STACK.scheduler_ms_per_task_instance
    assert opts.parallelism == LOCAL_STACK.parallelism
    assert opts.shard_size == 7
    assert LOCAL_STACK.options(SimOptions(max_active_shards=3)).max_active_shards == 3


def test_the_calibration_sizes_admission_as_the_shipped_settings_do() -> None:
    assert LOCAL_STACK.scheduler_ms_per_task_instance == AvsimSettings().scheduler_ms_per_task_instance


def test_a_small_week_on_two_gpus_is_forecast_with_prepares_target(tmp_path: Path) -> None:
    doc = sample_manifest(20, time_scale=0.002, scenario_fail_rate=0.0)
    path = tmp_path / "week.json"
    path.write_text(json.dumps(doc))
    load = workload_from_manifest(validate_manifest(doc)).case_load()
    prepares = target_cases_in_flight(
        load,
        Pools(spot_gpus=2, cpus=8),
        floor=comfortable_cases(load, AvsimSettings().scheduler_ms_per_task_instance),
    )
    plan = run_plan(
        str(path),
        Capacity(gpus=2, cpus=8),
        local_stack_options(),
        search=False,
        time_scale=0.002,
        cases_in_flight=0,
    ).plan
    simulated = plan.outcomes["critical_path"].result.options
    assert prepares == 20
    assert simulated.cases_in_flight == prepares
