"""The capacity planner: a discrete-event simulation of a weekly run on given capacity.

It simulates the run in its real shape (shard runs of S cases admitted by cases in flight or W at a
time, pools, the scheduler's loop, Airflow's ordering, retries, spot preemption with checkpoints and
the on-demand fallback) under the same
priority rule the scheduler applies (:func:`avsim.priority.critical_path_priority`), and compares
it with Airflow's default ``downstream`` rule and FIFO. ``avsim plan`` is its command; the
modules, leaf first:

- :mod:`~avsim.planner.workload`: manifest -> cases and phases (:func:`workload_from_manifest`);
- :mod:`~avsim.planner.options`: :class:`Capacity`, :class:`SimOptions`;
- :mod:`~avsim.planner.simulate`: :func:`simulate` -> :class:`SimResult`;
- :mod:`~avsim.planner.bounds`: :func:`lower_bound`, :func:`smallest_gpus`, and the closed forms
  a deadline tracker calls in flight (:class:`WorkLeft`, :func:`estimate_finish_seconds`,
  :func:`gpus_for_deadline`);
- :mod:`~avsim.planner.report`: :func:`plan_capacity`, :func:`format_table`, :func:`plan_to_json`;
- :mod:`~avsim.planner.inflight`: admission by cases in flight for a plan (the target, the pools'
  pace, the scheduler's loop and its warning; the pure part is :mod:`avsim.plan.admission`);
- :mod:`~avsim.planner.plot`: :func:`write_progress_plot` (imports matplotlib when called).
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
