"""The planner's per-phase overhead, executor parallelism and time scale (issue 14, item 5).

Exact makespans of hand-computed instances: the overhead adds exactly N x overhead along a chain
of N phases, holds the phase's slots (so it also lengthens a queue), is no work (a checkpoint
does not save it), and 0 leaves every forecast as it was.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from avsim.cli import app
from avsim.manifest.sample import sample_manifest, write_sample
from avsim.manifest.validation import validate_manifest
from avsim.planner import (
    STRATEGIES,
    Capacity,
    PlannerError,
    SimOptions,
    Workload,
    lower_bound,
    simulate,
    workload_from_manifest,
)

DIGEST = "0" * 64


def phase(kind: str, seconds: float, *after: str, checkpoint: bool = False, **retry: Any) -> dict[str, Any]:
    return {
        "depends_on": list(after),
        "resources": {"class": kind, "gpus": 1 if kind == "gpu" else 0},
        "estimated_duration_seconds": seconds,
        "timeout_seconds": seconds * 10,
        "retry": retry,
        "command": ["true"],
        **({"checkpoint": True} if checkpoint else {}),
    }


def workload(phases: dict[str, dict[str, Any]], cases: int, run_phases: dict | None = None) -> Workload:
    doc = {
        "apiVersion": "avsim/v1",
        "run": {
            "name": "t",
            "iso_week": "2026-W02",
            "deadline": "2026-01-11T18:00:00Z",
            "build": {"build_id": "b1", "image": f"registry.example.com/sim@sha256:{DIGEST}"},
        },
        "graphs": {"g": {"phases": phases}},
        "cases": [
            {
                "id": f"c{i:03d}",
                "graph": "g",
                "scenario": {"uri": "s3://s/x.json", "version": "v1"},
                "seed": i,
            }
            for i in range(cases)
        ],
        "run_phases": run_phases or {},
    }
    return workload_from_manifest(validate_manifest(doc))


CHAIN = {
    "prepare": phase("cpu", 60),
    "simulate": phase("gpu", 600, "prepare"),
    "evaluate": phase("cpu", 120, "simulate"),
    "report": phase("cpu", 60, "evaluate"),
}
PLENTY = Capacity(gpus=50, cpus=50)


@pytest.mark.parametrize("overhead", [0.5, 7.0, 300.0])
def test_the_overhead_adds_exactly_n_times_itself_along_a_chain(overhead: float) -> None:
    # 4 phases per case and 1 run-level phase after every case: 5 on the path.
    w = workload(CHAIN, 3, run_phases={"summary": phase("cpu", 30)})
    for strategy in STRATEGIES:
        opts = SimOptions(strategy=strategy)
        bare = simulate(w, PLENTY, opts)
        loaded = simulate(w, PLENTY, replace(opts, phase_overhead_seconds=overhead))
        assert bare.makespan_seconds == 870
        assert loaded.makespan_seconds == pytest.approx(870 + 5 * overhead)
        assert loaded.case_end_seconds == pytest.approx((840 + 4 * overhead,) * 3)
    bound = lower_bound(w, PLENTY, SimOptions(phase_overhead_seconds=overhead))
    assert bound.seconds == pytest.approx(870 + 5 * overhead)


def test_the_overhead_is_added_to_every_shard_of_a_window() -> None:
    # One case per shard, one shard at a time: 3 chains one after the other, each 4 overheads longer.
    w = workload(CHAIN, 3)
    opts = SimOptions(shard_size=1, max_active_shards=1, shard_start_seconds=5)
    bare = simulate(w, PLENTY, opts).makespan_seconds
    loaded = simulate(w, PLENTY, replace(opts, phase_overhead_seconds=2)).makespan_seconds
    assert bare == 3 * (5 + 840)
    assert loaded == 3 * (5 + 840 + 4 * 2)


def test_the_run_level_phases_start_after_their_own_latency() -> None:
    # The chain ends at 840; summarize, the parent's poll and close_week take 7 s; the summary 30 s.
    w = workload(CHAIN, 2, run_phases={"summary": phase("cpu", 30)})
    opts = SimOptions(shard_size=1, max_active_shards=2, shard_start_seconds=5)
    assert simulate(w, PLENTY, opts).makespan_seconds == 5 + 840 + 30
    later = simulate(w, PLENTY, replace(opts, run_phases_start_seconds=7))
    assert later.makespan_seconds == 5 + 840 + 7 + 30 and later.case_end_seconds == (845, 845)
    with pytest.raises(PlannerError, match="run_phases_start_seconds"):
        SimOptions(run_phases_start_seconds=-1)


def test_the_overhead_holds_the_slot() -> None:
    # One GPU, three single-phase cases of 10 s: each attempt holds the GPU for 4 + 10 s.
    w = workload({"simulate": phase("gpu", 10)}, 3)
    r = simulate(w, Capacity(gpus=1, cpus=1), SimOptions(phase_overhead_seconds=4))
    assert r.case_end_seconds == (14, 28, 42)
    assert r.gpu_busy_seconds == 42
    assert lower_bound(w, Capacity(gpus=1, cpus=1), SimOptions(phase_overhead_seconds=4)).seconds == 42


def test_latency_before_the_queue_holds_no_slot() -> None:
    # One GPU, three 10 s cases, 6 s of overhead of which 2 s in the slot: every case waits 4 s
    # before it is queued, then the GPU serves them back to back for 2 + 10 s each.
    w = workload({"simulate": phase("gpu", 10)}, 3)
    opts = SimOptions(phase_overhead_seconds=6, phase_overhead_in_slot_seconds=2)
    r = simulate(w, Capacity(gpus=1, cpus=1), opts)
    assert r.case_end_seconds == (16, 28, 40) and r.gpu_busy_seconds == 36
    bound = lower_bound(w, Capacity(gpus=1, cpus=1), opts)
    assert (bound.critical_path_seconds, bound.gpu_seconds) == (16, 36)
    # Along a chain it is still N x the whole overhead.
    chain = workload(CHAIN, 1)
    assert simulate(chain, PLENTY, opts).makespan_seconds == 840 + 4 * 6
    with pytest.raises(PlannerError, match="phase_overhead_in_slot_seconds"):
        SimOptions(phase_overhead_seconds=1, phase_overhead_in_slot_seconds=2)


def test_zero_overhead_leaves_the_forecast_unchanged() -> None:
    w = workload_from_manifest(validate_manifest(sample_manifest(300, seed=3)))
    cap = Capacity(gpus=12, cpus=8, on_demand_gpus=2)
    base = SimOptions(shard_size=50, max_active_shards=3, preemption_rate=0.5, failure_rate=0.05, seed=4)
    for strategy in STRATEGIES:
        a = simulate(w, cap, replace(base, strategy=strategy))
        b = simulate(w, cap, replace(base, strategy=strategy, phase_overhead_seconds=0.0))
        assert a == b


def test_the_overhead_is_not_work_a_checkpoint_saves() -> None:
    # Attempt 1 fails at some point of its work; with checkpoints every 1 s of work, the retry
    # redoes less than 1 s of work plus its own overhead, whatever the overhead.
    w = workload({"simulate": phase("gpu", 100, checkpoint=True, infrastructure=1, delay_seconds=0)}, 1)
    opts = SimOptions(failure_rate=0.5, checkpoint_seconds=1.0, seed=0)
    seed = next(s for s in range(200) if simulate(w, PLENTY, replace(opts, seed=s)).infra_failures == 1)
    opts = replace(opts, seed=seed)
    bare = simulate(w, PLENTY, opts)
    loaded = simulate(w, PLENTY, replace(opts, phase_overhead_seconds=30))
    assert loaded.infra_failures == 1 and loaded.attempts == 2
    # Two attempts, each 30 s of overhead; the work lost and redone is the same.
    assert loaded.makespan_seconds == pytest.approx(bare.makespan_seconds + 2 * 30)
    assert loaded.lost_gpu_seconds == pytest.approx(bare.lost_gpu_seconds)
    assert bare.lost_gpu_seconds < 1


def test_parallelism_caps_phases_running_across_pools() -> None:
    # 4 single-phase CPU cases and 2 GPU ones, all 10 s; pools have room for all, the executor for 2.
    w = workload({"prepare": phase("cpu", 10)}, 4)
    cap = Capacity(gpus=4, cpus=4)
    assert simulate(w, cap).makespan_seconds == 10
    assert simulate(w, cap, SimOptions(parallelism=2)).makespan_seconds == 20
    assert simulate(w, cap, SimOptions(parallelism=3, phase_overhead_seconds=1)).makespan_seconds == 22
    with pytest.raises(PlannerError, match="parallelism"):
        SimOptions(parallelism=0)
    with pytest.raises(PlannerError, match="phase_overhead_seconds"):
        SimOptions(phase_overhead_seconds=-1)


def test_a_scaled_workload_works_its_estimates_times_the_scale() -> None:
    w = workload(CHAIN, 2, run_phases={"summary": phase("cpu", 30)})
    fast = w.scaled(0.01)
    assert [p.seconds for p in fast.cases[0].phases] == pytest.approx([0.6, 6.0, 1.2, 0.6])
    assert [p.path_seconds for p in fast.cases[0].phases] == [p.path_seconds for p in w.cases[0].phases]
    assert fast.cases[0].phases is fast.cases[1].phases  # cases of a graph still share their phases
    assert simulate(fast, PLENTY).makespan_seconds == pytest.approx(8.7)
    assert w.scaled(1.0) == w
    with pytest.raises(ValueError, match="positive"):
        w.scaled(0)


def test_production_phases_barely_notice_seconds_of_overhead() -> None:
    """30-minute phases: a few seconds per phase move a week's makespan by well under 1 %."""
    w = workload_from_manifest(validate_manifest(sample_manifest(1_000, seed=5)))
    cap = Capacity(gpus=28, cpus=20)
    opts = SimOptions(shard_size=250, max_active_shards=6)
    base = simulate(w, cap, opts).makespan_seconds
    loaded = simulate(w, cap, replace(opts, phase_overhead_seconds=10)).makespan_seconds
    assert 1.0 < loaded / base < 1.01


runner = CliRunner()


def makespan(args: list[str], env: dict[str, str] | None = None) -> float:
    done = runner.invoke(app, ["plan", *args, "--json", "--no-search"], env=env)
    assert done.exit_code == 0, done.output
    return float(json.loads(done.output)["strategies"]["critical_path"]["makespan_seconds"])


def test_the_plan_command_takes_the_overhead_from_its_option_or_the_configuration(tmp_path: Path) -> None:
    manifest = str(write_sample(tmp_path / "week.yaml", cases=20, iso_week="2026-W10"))
    # The window of whole shard runs without a simulated scheduler loop: the model the bench calibrates
    # (its measured latency holds the loop already).
    common = [
        manifest,
        "--gpus",
        "2",
        "--cpus",
        "4",
        "--shard-size",
        "10",
        "--max-active-shards",
        "2",
        "--admission",
        "window",
        "--scheduler-ms-per-task-instance",
        "0",
    ]
    fast = [*common, "--time-scale", "0.002"]
    bare = makespan(fast)
    with_option = makespan([*fast, "--phase-overhead-seconds", "6"])
    configured = makespan(fast, env={"AIRFLOW__AVSIM__PLANNER_PHASE_OVERHEAD_SECONDS": "6"})
    overridden = makespan(
        [*fast, "--phase-overhead-seconds", "0"], env={"AIRFLOW__AVSIM__PLANNER_PHASE_OVERHEAD_SECONDS": "6"}
    )
    assert with_option == configured > bare == overridden
    # A 20-case week of 4-5 phases per case on 2 GPUs and 4 CPU slots: at least 5 overheads along
    # each chain, and the GPU phases' overheads queue on the 2 GPUs.
    assert with_option - bare >= 5 * 6
    # The time scale scales the work only: at scale 1 the same week of 30-minute phases.
    assert makespan(common) == pytest.approx(bare / 0.002)
    # Every part the bench calibrates can be given to the command; it simulates what the API does.
    parts = [
        "--phase-overhead-in-slot-seconds",
        "2",
        "--shard-start-seconds",
        "30",
        "--run-phases-start-seconds",
        "6",
    ]
    from avsim.manifest.loader import load_manifest

    scaled = workload_from_manifest(load_manifest(manifest).manifest).scaled(0.002)
    opts = SimOptions(
        shard_size=10,
        max_active_shards=2,
        phase_overhead_seconds=6,
        phase_overhead_in_slot_seconds=2,
        shard_start_seconds=30,
        run_phases_start_seconds=6,
    )
    expected = simulate(scaled, Capacity(gpus=2, cpus=4), opts).makespan_seconds
    assert makespan([*fast, "--phase-overhead-seconds", "6", *parts]) == pytest.approx(expected, abs=0.01)
    bad = runner.invoke(
        app, ["plan", *common, "--json"], env={"AIRFLOW__AVSIM__PLANNER_PHASE_OVERHEAD_SECONDS": "soon"}
    )
    assert bad.exit_code != 0 and "planner_phase_overhead_seconds" in bad.output
