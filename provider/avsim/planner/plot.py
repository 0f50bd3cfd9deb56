"""The plan as a PNG: cases finished and GPUs in use over time, one line per strategy.

The only module of the planner that imports matplotlib, and only when called (Agg backend: no display).
"""

from __future__ import annotations

import math
from pathlib import Path

from avsim.errors import ConfigError
from avsim.planner.report import CapacityPlan

_COLORS = {"critical_path": "#1b7837", "downstream": "#b2182b", "fifo": "#2166ac"}


def write_progress_plot(plan: CapacityPlan, path: str | Path) -> Path:
    """Write the plot to ``path`` (PNG) and return it."""
    from avsim.report.plots import PLOTS_NEED, plots_available

    if not plots_available():
        raise ConfigError(PLOTS_NEED)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig, (done_ax, gpu_ax) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, constrained_layout=True)
    try:
        for name, out in plan.outcomes.items():
            r = out.result
            color = _COLORS.get(name)
            hours = [0.0, *(t / 3600 for t in r.case_end_seconds)]
            done_ax.step(
                hours,
                range(len(hours)),
                where="post",
                color=color,
                label=f"{name} ({plan.ratio(name):.3f} x bound)",
            )
            times = [t / 3600 for t, _ in r.gpus_in_use]
            gpu_ax.step(
                times, [g for _, g in r.gpus_in_use], where="post", color=color, linewidth=0.8, label=name
            )
        for ax in (done_ax, gpu_ax):
            ax.axvline(
                plan.bound.seconds / 3600, color="grey", linestyle="--", linewidth=1, label="lower bound"
            )
            if plan.deadline_seconds is not None:
                ax.axvline(
                    plan.deadline_seconds / 3600, color="black", linestyle=":", linewidth=1, label="deadline"
                )
            ax.grid(alpha=0.3)
        gpu_ax.axhline(plan.capacity.total_gpus, color="grey", linewidth=0.8)
        # Zoom on the runs; a deadline far beyond them is left off the axis (it is in the title).
        ends = [
            o.result.makespan_seconds
            for o in plan.outcomes.values()
            if math.isfinite(o.result.makespan_seconds)
        ]
        right = max([plan.bound.seconds, *ends])
        if plan.deadline_seconds is not None and plan.deadline_seconds < 1.5 * right:
            right = max(right, plan.deadline_seconds)
        gpu_ax.set_xlim(0, right / 3600 * 1.03)
        done_ax.set_ylabel("cases finished")
        gpu_ax.set_ylabel("GPUs in use")
        gpu_ax.set_xlabel("hours from the start")
        c = plan.capacity
        done_ax.set_title(
            f"{plan.cases:,} cases on {c.gpus:,} spot + {c.on_demand_gpus:,} on-demand GPUs, {c.cpus:,} CPUs "
            f"(S = {plan.options.shard_size}, W = {plan.options.max_active_shards}"
            + (
                f", at most {plan.options.cases_in_flight:,} cases in flight)"
                if plan.options.cases_in_flight is not None
                else ")"
            )
            + (
                f", deadline {plan.deadline_seconds / 3600:.0f} h"
                if plan.deadline_seconds is not None
                else ""
            )
        )
        done_ax.legend(loc="lower right")
        fig.savefig(target, dpi=110)
    finally:
        plt.close(fig)
    return target
