"""The capacity planner: a discrete-event simulation of a weekly run on given capacity.

``avsim plan`` is its command. Leaf first: :mod:`~avsim.planner.workload` (manifest -> cases),
:mod:`~avsim.planner.options`, :mod:`~avsim.planner.simulate`, :mod:`~avsim.planner.bounds` (the lower
bound and the deadline tracker's closed forms), :mod:`~avsim.planner.report`,
:mod:`~avsim.planner.inflight` (admission for a plan), :mod:`~avsim.planner.calibration` and
:mod:`~avsim.planner.plot` (docs/design.md, "Priority and capacity").
"""

from __future__ import annotations

from avsim.planner.bounds import (
    DEFAULT_EFFICIENCY,
    GpuSearch,
    LowerBound,
    WorkLeft,
    estimate_finish_seconds,
    gpus_for_deadline,
    lower_bound,
    smallest_gpus,
)
from avsim.planner.options import STRATEGIES, Capacity, PlannerError, SimOptions
from avsim.planner.report import CapacityPlan, format_table, plan_capacity, plan_to_json
from avsim.planner.result import SimResult
from avsim.planner.simulate import simulate
from avsim.planner.workload import CaseWork, PhaseWork, Workload, week_start, workload_from_manifest

__all__ = [
    "DEFAULT_EFFICIENCY",
    "STRATEGIES",
    "Capacity",
    "CapacityPlan",
    "CaseWork",
    "GpuSearch",
    "LowerBound",
    "PhaseWork",
    "PlannerError",
    "SimOptions",
    "SimResult",
    "WorkLeft",
    "Workload",
    "estimate_finish_seconds",
    "format_table",
    "gpus_for_deadline",
    "lower_bound",
    "plan_capacity",
    "plan_to_json",
    "simulate",
    "smallest_gpus",
    "week_start",
    "workload_from_manifest",
]
