"""The orchestrator's cost on this project's 2-core machine, as the planner's options take it.

``bench/planner_forecast.py`` measures it on a real stack (docs/performance.md, "Planner forecast
under admission", has the run and its command); :data:`LOCAL_STACK` is the figure it printed last.
A forecast of a week on such a stack (the demo, a test's stack) starts from :func:`local_stack_options`;
a production week leaves these at 0 (:class:`SimOptions`' defaults): 30-minute phases do not notice seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from avsim.planner.options import SimOptions


@dataclass(frozen=True)
class StackCalibration:
    """What ``bench/planner_forecast.py`` prints as the calibration, in :class:`SimOptions`' terms."""

    phase_overhead_seconds: float
    phase_overhead_in_slot_seconds: float
    shard_start_seconds: float
    run_phases_start_seconds: float
    #: ``[avsim] scheduler_ms_per_task_instance`` the stack's ``prepare`` sized its target with.
    scheduler_ms_per_task_instance: float
    #: ``[core] parallelism`` of the stack.
    parallelism: int

    def options(self, base: SimOptions | None = None, **changes: Any) -> SimOptions:
        """``base`` (default: :class:`SimOptions`' defaults) with this calibration, then ``changes``."""
        calibrated = replace(
            base or SimOptions(),
            phase_overhead_seconds=self.phase_overhead_seconds,
            phase_overhead_in_slot_seconds=self.phase_overhead_in_slot_seconds,
            shard_start_seconds=self.shard_start_seconds,
            run_phases_start_seconds=self.run_phases_start_seconds,
            scheduler_ms_per_task_instance=self.scheduler_ms_per_task_instance,
            parallelism=self.parallelism,
        )
        return replace(calibrated, **changes)


#: ``bench/planner_forecast.py --quick`` on 7 December 2026 (LocalExecutor, SQLite, 2 spot GPUs, 4 CPU
#: slots, load 0.8 to 1.6): 1.17 s per phase (0.62 s latency + 0.55 s in the slot), a shard run's
#: first phase 6.5 s after admission lets it start, the run-level phases 7.0 s after the last shard.
LOCAL_STACK = StackCalibration(
    phase_overhead_seconds=1.17,
    phase_overhead_in_slot_seconds=0.55,
    shard_start_seconds=6.5,
    run_phases_start_seconds=7.0,
    scheduler_ms_per_task_instance=3.0,
    parallelism=16,
)


def local_stack_options(**changes: Any) -> SimOptions:
    """:class:`SimOptions` calibrated for a stack on this project's machine (:data:`LOCAL_STACK`)."""
    return LOCAL_STACK.options(**changes)
