"""One capacity plan: every strategy simulated on the same workload and capacity, as a table or JSON."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from avsim.phases.contract import Outcome
from avsim.planner.bounds import GpuSearch, LowerBound, lower_bound, smallest_gpus
from avsim.planner.options import STRATEGIES, Capacity, SimOptions
from avsim.planner.result import SimResult
from avsim.planner.simulate import simulate
from avsim.planner.workload import Workload


@dataclass(frozen=True)
class StrategyOutcome:
    result: SimResult
    #: The GPU search for the deadline (None when there is no deadline or it was not asked for).
    search: GpuSearch | None


@dataclass(frozen=True)
class CapacityPlan:
    cases: int
    capacity: Capacity
    options: SimOptions
    bound: LowerBound
    deadline_seconds: float | None
    outcomes: dict[str, StrategyOutcome]
    #: The most phase task instances the active shard runs hold: what each scheduler loop re-evaluates.
    window_task_instances: int = 0

    def ratio(self, strategy: str) -> float:
        """Simulated makespan / lower bound."""
        return self.outcomes[strategy].result.makespan_seconds / self.bound.seconds


def plan_capacity(
    workload: Workload,
    capacity: Capacity,
    options: SimOptions | None = None,
    *,
    deadline_seconds: float | None = None,
    strategies: Sequence[str] = STRATEGIES,
    search: bool = True,
) -> CapacityPlan:
    """Simulate ``workload`` under each strategy (``options.strategy`` is replaced) and, given a
    deadline and ``search``, find each strategy's smallest spot GPU count that meets it."""
    options = options or SimOptions()
    outcomes = {}
    for name in strategies:
        opts = replace(options, strategy=name)
        result = simulate(workload, capacity, opts)
        found = None
        if deadline_seconds is not None and search:
            found = smallest_gpus(workload, capacity, opts, deadline_seconds)
        outcomes[name] = StrategyOutcome(result, found)
    return CapacityPlan(
        cases=len(workload.cases),
        capacity=capacity,
        options=options,
        bound=lower_bound(workload, capacity, options),
        deadline_seconds=deadline_seconds,
        outcomes=outcomes,
        window_task_instances=workload.window_task_instances(options.shard_size, options.max_active_shards),
    )


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.2f} h" if math.isfinite(seconds) else "never"


def _gpus_needed(search: GpuSearch | None) -> str:
    if search is None:
        return "-"
    return f"{search.gpus:,}" if search.gpus is not None else "none"


def format_table(plan: CapacityPlan) -> str:
    """The plan as a readable text table (what ``avsim plan`` prints)."""
    c, o, b = plan.capacity, plan.options, plan.bound
    lines = [
        f"{plan.cases:,} cases: {b.gpu_seconds / 3600:,.0f} GPU-hours, {b.cpu_seconds / 3600:,.0f} CPU-hours of "
        f"work, longest case {b.critical_path_seconds / 60:.0f} min",
        f"capacity: {c.gpus:,} spot GPUs + {c.on_demand_gpus:,} on-demand GPUs, {c.cpus:,} CPU slots",
        f"shape: S = {o.shard_size} cases per shard run, W = {o.max_active_shards} active"
        + (", shard runs with logical dates" if o.shard_logical_dates else "")
        + (
            f", max {o.max_active_tasks_per_shard} tasks per shard run"
            if o.max_active_tasks_per_shard
            else ""
        ),
    ]
    if o.cases_in_flight is None:
        lines.append(
            f"scheduler: up to {plan.window_task_instances:,} phase task instances in the {o.max_active_shards} "
            'active shard runs, each re-evaluated every scheduler loop (docs/design.md, "Choosing S and W")'
        )
    else:  # admitting: the loop carries the cases in flight (the admission lines below say how many)
        lines.append(
            f"admission: shard runs start as finished cases make room for them, at most {o.cases_in_flight:,} "
            'unfinished cases (docs/design.md, "Admission by cases in flight")'
        )
    if o.preemption_rate:
        lines.append(
            f"spot preemption: {o.preemption_rate * 100:g} % per GPU-hour, checkpoints every "
            f"{o.checkpoint_seconds:g} s of work"
        )
    if o.failure_rate or o.duration_spread:
        lines.append(
            f"infrastructure failures: {o.failure_rate * 100:g} % of attempts; durations ±{o.duration_spread * 100:g} %"
        )
    lines.append(
        f"lower bound: {_hours(b.seconds)} (set by {b.binding}: critical path {_hours(b.critical_path_seconds)}, "
        f"GPU work {_hours(b.gpu_bound_seconds)}, CPU work {_hours(b.cpu_bound_seconds)}; "
        f"+ run-level phases {_hours(b.run_phase_seconds)})"
    )
    if plan.deadline_seconds is not None:
        lines.append(f"deadline: {_hours(plan.deadline_seconds)} after the start")
    header = (
        "strategy",
        "makespan",
        "/ bound",
        "GPU-hours",
        "GPU util",
        "first case",
        Outcome.PREEMPTED.value,  # attempts the simulation preempted, named as the class they end in
        "GPUs for deadline",
    )
    rows = [header]
    for name, out in plan.outcomes.items():
        r = out.result
        first = r.first_case_seconds
        rows.append(
            (
                name,
                _hours(r.makespan_seconds),
                f"{plan.ratio(name):.3f}",
                f"{r.gpu_hours:,.0f}",
                f"{r.gpu_utilisation * 100:.1f} %",
                f"{first / 60:.0f} min" if first is not None else "-",
                f"{r.preemptions:,}",
                _gpus_needed(out.search),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.append("")
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    for name, out in plan.outcomes.items():
        if out.search is not None and out.search.gpus is None:
            lines.append(f"{name}: {out.search.reason}")
    return "\n".join(lines)


def plan_to_json(plan: CapacityPlan) -> dict[str, Any]:
    """The plan as JSON-friendly data (``avsim plan --json``)."""
    b = plan.bound

    def finite(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    return {
        "cases": plan.cases,
        "capacity": {
            "gpus": plan.capacity.gpus,
            "on_demand_gpus": plan.capacity.on_demand_gpus,
            "cpus": plan.capacity.cpus,
        },
        "options": {k: v for k, v in vars(plan.options).items() if k != "strategy"},
        "lower_bound": {
            "seconds": b.seconds,
            "binding": b.binding,
            "critical_path_seconds": b.critical_path_seconds,
            "gpu_work_seconds": b.gpu_seconds,
            "cpu_work_seconds": b.cpu_seconds,
            "run_phase_seconds": b.run_phase_seconds,
        },
        "deadline_seconds": plan.deadline_seconds,
        "window_task_instances": plan.window_task_instances,
        "strategies": {
            name: {
                "makespan_seconds": finite(out.result.makespan_seconds),
                "ratio_to_lower_bound": plan.ratio(name),
                "gpu_hours": out.result.gpu_hours,
                "on_demand_gpu_hours": out.result.on_demand_gpu_seconds / 3600,
                "lost_gpu_hours": out.result.lost_gpu_seconds / 3600,
                "gpu_utilisation": out.result.gpu_utilisation,
                "cpu_utilisation": out.result.cpu_utilisation,
                "first_case_seconds": out.result.first_case_seconds,
                "cases_failed": out.result.cases_failed,
                "attempts": out.result.attempts,
                "preemptions": out.result.preemptions,
                "on_demand_attempts": out.result.on_demand_attempts,
                "infra_failures": out.result.infra_failures,
                "smallest_gpus_for_deadline": out.search.gpus if out.search else None,
                "search_reason": out.search.reason if out.search else None,
                "search_tried": [[g, finite(m)] for g, m in out.search.tried] if out.search else None,
            }
            for name, out in plan.outcomes.items()
        },
    }
