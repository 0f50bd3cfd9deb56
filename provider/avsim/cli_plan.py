"""``avsim plan``: simulate a week on given capacity (the options are declared once, below)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from avsim.cli_common import MAX_CASES, MAX_SLOTS, finite
from avsim.settings import ADMISSION_MODES

#: ``--admission``'s choices: ``[avsim] admission``'s values.
AdmissionMode = Enum("AdmissionMode", {mode: mode for mode in ADMISSION_MODES}, type=str)  # type: ignore[misc]

Manifest = Annotated[str, typer.Argument(help="Path or URI of the manifest.")]
Gpus = Annotated[
    int, typer.Option("--gpus", min=0, max=MAX_SLOTS, help="Spot GPU slots (the GPU spot pool).")
]
Cpus = Annotated[
    int, typer.Option("--cpus", min=0, max=MAX_SLOTS, help="CPU slots (the CPU pool; one per CPU phase).")
]
OnDemandGpus = Annotated[
    int, typer.Option("--on-demand-gpus", min=0, max=MAX_SLOTS, help="On-demand GPU slots.")
]
Deadline = Annotated[
    str | None, typer.Option(help="Deadline, ISO with zone (default: the manifest's run.deadline).")
]
DeadlineHours = Annotated[
    float | None,
    typer.Option("--deadline-hours", min=0, callback=finite, help="Deadline in hours after the start."),
]
Start = Annotated[
    str | None, typer.Option(help="The run's start, ISO (default: Monday 06:00 UTC of its week).")
]
PreemptionRate = Annotated[
    float, typer.Option(min=0, callback=finite, help="Spot preemptions per GPU-hour (0.05: 5 %/hour).")
]
CheckpointSeconds = Annotated[
    float, typer.Option(min=1, callback=finite, help="Work between checkpoints of a phase.")
]
FailureRate = Annotated[
    float, typer.Option(min=0, max=0.99, callback=finite, help="Share of attempts failing (infrastructure).")
]
DurationSpread = Annotated[
    float, typer.Option(min=0, max=0.99, callback=finite, help="Durations vary by up to ± this share.")
]
ShardSize = Annotated[
    int | None,
    typer.Option("--shard-size", min=1, max=MAX_CASES, help="S (default: [avsim] shard_size)."),
]
MaxActiveShards = Annotated[
    int | None,
    typer.Option("--max-active-shards", min=1, max=MAX_SLOTS, help="W (default: [avsim] max_active_shards)."),
]
ShardLogicalDates = Annotated[
    bool,
    typer.Option(
        help="Shard runs carry increasing logical dates, as avsim triggers them "
        "(Airflow orders equal weights by them)."
    ),
]
MaxActiveTasks = Annotated[
    int | None, typer.Option(min=1, max=MAX_SLOTS, help="The shard DAG's max_active_tasks.")
]
Parallelism = Annotated[
    int | None, typer.Option(min=1, max=MAX_SLOTS, help="[core] parallelism: most phases running at once.")
]
PhaseOverhead = Annotated[
    float | None,
    typer.Option(
        "--phase-overhead-seconds",
        min=0,
        callback=finite,
        help="Orchestrator seconds per phase attempt besides its work "
        "(default: [avsim] planner_phase_overhead_seconds, 0).",
    ),
]
PhaseOverheadInSlot = Annotated[
    float | None,
    typer.Option(
        "--phase-overhead-in-slot-seconds",
        min=0,
        callback=finite,
        help="Of the overhead, the part a phase holds its slots for (default: all; the rest is latency).",
    ),
]
ShardStart = Annotated[
    float,
    typer.Option(
        min=0,
        callback=finite,
        help="From a window slot freeing to the next shard run's first phases being ready.",
    ),
]
RunPhasesStart = Annotated[
    float,
    typer.Option(
        min=0, callback=finite, help="From the last shard run's end to the run-level phases being ready."
    ),
]
TimeScale = Annotated[
    float,
    typer.Option(
        "--time-scale",
        min=1e-9,
        callback=finite,
        help="Phases work their estimate x this (a demo's fake phases).",
    ),
]
Seed = Annotated[int, typer.Option(help="Seed of preemptions, failures and durations.")]
CasesInFlight = Annotated[
    int | None,
    typer.Option(
        "--cases-in-flight",
        min=0,
        max=MAX_CASES,
        help="With --admission cases_in_flight: admit shard runs as finished cases make room, up to this "
        "many unfinished cases (default: [avsim] cases_in_flight; 0 derives it from the pools).",
    ),
]
Admission = Annotated[
    AdmissionMode | None,
    typer.Option(
        "--admission",
        help="cases_in_flight: shard runs admitted as finished cases make room, up to --cases-in-flight, "
        "of a third of it each. window: W whole shard runs of S, the next when one ends. "
        "Default: [avsim] admission, as the weekly run does.",
    ),
]
SchedulerMs = Annotated[
    float | None,
    typer.Option(
        "--scheduler-ms-per-task-instance",
        min=0,
        max=10_000,
        callback=finite,
        help="The scheduler loop's milliseconds per unfinished task instance (default: [avsim] "
        "scheduler_ms_per_task_instance, 3, this project's test machine); 0: no loop simulated.",
    ),
]
MaxTisPerLoop = Annotated[
    int | None,
    typer.Option(
        "--max-tis-per-loop",
        min=1,
        max=MAX_SLOTS,
        help="Most task instances one loop queues (default: [scheduler] max_tis_per_query).",
    ),
]
Search = Annotated[bool, typer.Option(help="Search the smallest GPU count that meets the deadline.")]
Plot = Annotated[Path | None, typer.Option(help="Write a PNG of progress over time per strategy here.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of the table.")]


@dataclass(frozen=True)
class Configured:
    """What ``plan`` takes from the configuration where its options say nothing."""

    shard_size: int
    max_active_shards: int
    cases_in_flight: int | None  # None: the window
    phase_overhead_seconds: float
    ms: float
    ms_setting: str
    per_loop: int
    per_loop_setting: str


def configured(
    shard_size: int | None,
    max_active_shards: int | None,
    cases_in_flight: int | None,
    admission: AdmissionMode | None,
    phase_overhead_seconds: float | None,
    ms: float | None,
    per_loop: int | None,
) -> Configured:
    """The options given, the rest from ``[avsim]`` and ``[scheduler]``."""
    from avsim.planner.command import configured_phase_overhead, configured_scheduler
    from avsim.settings import load_settings

    settings = load_settings()
    ms_configured, per_loop_configured = configured_scheduler()
    mode = admission.value if admission is not None else settings.admission
    in_flight = settings.cases_in_flight if cases_in_flight is None else cases_in_flight
    return Configured(
        shard_size=shard_size or settings.shard_size,
        max_active_shards=max_active_shards or settings.max_active_shards,
        cases_in_flight=None if mode == "window" else in_flight,
        phase_overhead_seconds=(
            configured_phase_overhead() if phase_overhead_seconds is None else phase_overhead_seconds
        ),
        ms=ms_configured if ms is None else ms,
        ms_setting=(
            f"{ms_configured:g} ms ([avsim] scheduler_ms_per_task_instance)"
            if ms is None
            else f"{ms:g} ms (--scheduler-ms-per-task-instance)"
        ),
        per_loop=per_loop_configured if per_loop is None else per_loop,
        per_loop_setting="[scheduler] max_tis_per_query" if per_loop is None else "--max-tis-per-loop",
    )


def plan(
    manifest: Manifest,
    gpus: Gpus,
    cpus: Cpus,
    on_demand_gpus: OnDemandGpus = 0,
    deadline: Deadline = None,
    deadline_hours: DeadlineHours = None,
    start: Start = None,
    preemption_rate: PreemptionRate = 0.0,
    checkpoint_seconds: CheckpointSeconds = 300.0,
    failure_rate: FailureRate = 0.0,
    duration_spread: DurationSpread = 0.0,
    shard_size: ShardSize = None,
    max_active_shards: MaxActiveShards = None,
    shard_logical_dates: ShardLogicalDates = True,
    max_active_tasks_per_shard: MaxActiveTasks = None,
    parallelism: Parallelism = None,
    phase_overhead_seconds: PhaseOverhead = None,
    phase_overhead_in_slot_seconds: PhaseOverheadInSlot = None,
    shard_start_seconds: ShardStart = 0.0,
    run_phases_start_seconds: RunPhasesStart = 0.0,
    time_scale: TimeScale = 1.0,
    seed: Seed = 0,
    cases_in_flight: CasesInFlight = None,
    admission: Admission = None,
    scheduler_ms_per_task_instance: SchedulerMs = None,
    max_tis_per_loop: MaxTisPerLoop = None,
    search: Search = True,
    plot: Plot = None,
    as_json: AsJson = False,
) -> None:
    """Simulate the week on given capacity: makespan, lower bound, GPU-hours, GPUs for the deadline."""
    from avsim.planner.command import run_plan
    from avsim.planner.options import Capacity, SimOptions

    cfg = configured(
        shard_size,
        max_active_shards,
        cases_in_flight,
        admission,
        phase_overhead_seconds,
        scheduler_ms_per_task_instance,
        max_tis_per_loop,
    )
    options = SimOptions(
        shard_size=cfg.shard_size,
        max_active_shards=cfg.max_active_shards,
        preemption_rate=preemption_rate,
        checkpoint_seconds=checkpoint_seconds,
        failure_rate=failure_rate,
        duration_spread=duration_spread,
        shard_logical_dates=shard_logical_dates,
        max_active_tasks_per_shard=max_active_tasks_per_shard,
        parallelism=parallelism,
        phase_overhead_seconds=cfg.phase_overhead_seconds,
        phase_overhead_in_slot_seconds=phase_overhead_in_slot_seconds,
        shard_start_seconds=shard_start_seconds,
        run_phases_start_seconds=run_phases_start_seconds,
        seed=seed,
        scheduler_ms_per_task_instance=cfg.ms,
        max_tis_per_loop=cfg.per_loop,
    )
    output = run_plan(
        manifest,
        Capacity(gpus=gpus, cpus=cpus, on_demand_gpus=on_demand_gpus),
        options,
        deadline=deadline,
        deadline_hours=deadline_hours,
        start=start,
        search=search,
        plot=plot,
        as_json=as_json,
        time_scale=time_scale,
        cases_in_flight=cfg.cases_in_flight,
        # Admitting by cases in flight, W caps nothing: shard runs start as the week has room.
        admission_max_active_shards=None,
        ms_setting=cfg.ms_setting,
        per_loop_setting=cfg.per_loop_setting,
    )
    typer.echo(output.text)
