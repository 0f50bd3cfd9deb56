"""What ``avsim plan`` does, apart from parsing its options: manifest -> plan -> table/JSON/plot."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from avsim.planner.options import Capacity, PlannerError, SimOptions
from avsim.planner.report import CapacityPlan, format_table, plan_capacity, plan_to_json
from avsim.planner.workload import Workload, week_start, workload_from_manifest


def parse_time(value: str, option: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise PlannerError(
            f"{option} {value!r} is not an ISO time; write it like 2026-12-06T18:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise PlannerError(f"{option} {value!r} has no time zone; add one, e.g. 2026-12-06T18:00:00Z")
    return parsed


def deadline_seconds(
    workload: Workload,
    *,
    deadline: str | None = None,
    deadline_hours: float | None = None,
    start: str | None = None,
) -> float | None:
    """Seconds from the run's start to its deadline: ``deadline_hours``, else ``deadline`` (ISO), else
    the manifest's ``run.deadline``; the start is ``start`` (ISO), else the weekly schedule's Monday
    06:00 UTC of the manifest's ISO week."""
    if deadline is not None and deadline_hours is not None:
        raise PlannerError("give --deadline or --deadline-hours, not both")
    if deadline_hours is not None:
        if deadline_hours <= 0:
            raise PlannerError(f"--deadline-hours {deadline_hours:g}: use a positive number of hours")
        return deadline_hours * 3600.0
    end = parse_time(deadline, "--deadline") if deadline is not None else workload.deadline
    if end is None:
        return None
    if start is not None:
        begin = parse_time(start, "--start")
    elif workload.iso_week:
        begin = week_start(workload.iso_week)
    else:
        raise PlannerError("the run's start is unknown; give --start or --deadline-hours")
    seconds = (end - begin).total_seconds()
    if seconds <= 0:
        raise PlannerError(
            f"the deadline {end.isoformat()} is not after the run's start {begin.isoformat()}; "
            "give a later --deadline, or --start"
        )
    return seconds


@dataclass(frozen=True)
class PlanOutput:
    plan: CapacityPlan
    text: str
    plot: Path | None


def run_plan(
    source: str,
    capacity: Capacity,
    options: SimOptions,
    *,
    deadline: str | None = None,
    deadline_hours: float | None = None,
    start: str | None = None,
    search: bool = True,
    plot: str | Path | None = None,
    as_json: bool = False,
    time_scale: float = 1.0,
) -> PlanOutput:
    """Load and validate the manifest, simulate every strategy, and render the result.

    ``time_scale``: phases work their estimate times it (the fake phases of a demo or bench week);
    the deadline is not scaled."""
    from avsim.manifest.loader import load_manifest

    workload = workload_from_manifest(load_manifest(source).manifest)
    if time_scale != 1.0:
        workload = workload.scaled(time_scale)
    seconds = deadline_seconds(workload, deadline=deadline, deadline_hours=deadline_hours, start=start)
    plan = plan_capacity(workload, capacity, options, deadline_seconds=seconds, search=search)
    written = None
    if plot is not None:
        from avsim.planner.plot import write_progress_plot

        written = write_progress_plot(plan, plot)
    if as_json:
        text = json.dumps(plan_to_json(plan), indent=2, default=str)
    else:
        text = format_table(plan) + (f"\nplot: {written}" if written else "")
    return PlanOutput(plan, text, written)


def configured_phase_overhead() -> float:
    """``[avsim] planner_phase_overhead_seconds`` (environment overrides as for any Airflow option)."""
    from avsim.settings import OPTIONS, airflow_config

    key = "planner_phase_overhead_seconds"
    value = airflow_config("avsim", key, OPTIONS[key][0])
    try:
        seconds = float(value)
    except ValueError:
        raise PlannerError(f"[avsim] {key} = {value!r}; use a number of seconds") from None
    if not 0 <= seconds <= 86_400:
        raise PlannerError(f"[avsim] {key} = {value}; use seconds in [0, 86400]")
    return seconds
