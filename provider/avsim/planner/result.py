"""What one simulated run of the capacity planner gives (:func:`avsim.planner.simulate.simulate`):
its makespan, what the pools held, what failed, and what the scheduler's loop carried."""

from __future__ import annotations

import math
from dataclasses import dataclass

from avsim.planner.options import Capacity, SimOptions


@dataclass(frozen=True)
class SimResult:
    strategy: str
    capacity: Capacity
    options: SimOptions
    #: False when the simulation stopped at ``stop_after`` (the run would end later).
    complete: bool
    #: Seconds from the run's start to its end (the last run-level phase); ``inf`` if not complete.
    makespan_seconds: float
    cases: int
    cases_failed: int
    #: When each case ended, ascending (seconds from the start).
    case_end_seconds: tuple[float, ...]
    #: GPU-seconds held by attempts (lost work included), all GPU pools; and the on-demand part.
    gpu_busy_seconds: float
    on_demand_gpu_seconds: float
    cpu_busy_seconds: float
    #: GPU-seconds of work preemptions and failures threw away.
    lost_gpu_seconds: float
    attempts: int
    preemptions: int
    infra_failures: int
    on_demand_attempts: int
    #: (time, GPUs in use) at every change.
    gpus_in_use: tuple[tuple[float, int], ...]
    #: What the scheduler's loop carries: unfinished phase task instances of the active shard runs
    #: (a phase's on-demand twin is one more until the phase ends), at most and averaged over the run;
    #: of them, twins (averaged); the most unfinished cases and active shard runs at once.
    peak_task_instances: int = 0
    mean_task_instances: float = 0.0
    mean_twin_task_instances: float = 0.0
    peak_cases_in_flight: int = 0
    peak_active_shard_runs: int = 0
    #: The fewest unfinished cases while some cases still waited to start (None: none ever waited).
    min_cases_in_flight_waiting: int | None = None
    #: Scheduler loops simulated (0 without ``scheduler_ms_per_task_instance``), their mean and longest.
    loops: int = 0
    mean_loop_seconds: float = 0.0
    max_loop_seconds: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_busy_seconds / 3600.0

    @property
    def gpu_utilisation(self) -> float:
        """GPU-seconds held over GPU-seconds available (both GPU pools) until the run's end."""
        total = self.capacity.total_gpus * self.makespan_seconds
        return self.gpu_busy_seconds / total if total and math.isfinite(total) else 0.0

    @property
    def cpu_utilisation(self) -> float:
        total = self.capacity.cpus * self.makespan_seconds
        return self.cpu_busy_seconds / total if total and math.isfinite(total) else 0.0

    @property
    def twin_share(self) -> float:
        """On-demand twins' share of the unfinished phase task instances in flight (time-averaged)."""
        return self.mean_twin_task_instances / self.mean_task_instances if self.mean_task_instances else 0.0

    @property
    def first_case_seconds(self) -> float | None:
        return self.case_end_seconds[0] if self.case_end_seconds else None
