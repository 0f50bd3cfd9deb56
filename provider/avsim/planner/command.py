"""What ``avsim plan`` does, apart from parsing its options: manifest -> plan -> table/JSON/plot."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

from avsim.planner.inflight import AdmissionView, admission_options, admission_view, format_admission
from avsim.planner.options import Capacity, PlannerError, SimOptions
from avsim.planner.report import CapacityPlan, format_table, plan_capacity, plan_to_json
from avsim.planner.simulate import check_capacity
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
    cases_in_flight: int | None = None,
    admission_max_active_shards: int | None = None,
    ms_setting: str = "[avsim] scheduler_ms_per_task_instance",
    per_loop_setting: str = "[scheduler] max_tis_per_query",
) -> PlanOutput:
    """Load and validate the manifest, simulate every strategy, and render the result.

    ``time_scale``: phases work their estimate times it (the fake phases of a demo or bench week);
    the deadline is not scaled. ``cases_in_flight``: ``None`` simulates the window of whole shard
    runs (``options``' S and W); a number admits by cases in flight (0: the target derived from the
    pools), with ``admission_max_active_shards`` (``None``: no cap) instead of W. ``ms_setting`` and
    ``per_loop_setting`` name where the scheduler's figures came from, for the text."""
    from avsim.manifest.bounded import load_manifest_bounded

    # Within prepare's bounds (a child process; docs/security.md), as `avsim manifest validate` reads it.
    workload = workload_from_manifest(load_manifest_bounded(source).manifest)
    if time_scale != 1.0:
        workload = workload.scaled(time_scale)
    seconds = deadline_seconds(workload, deadline=deadline, deadline_hours=deadline_hours, start=start)
    check_capacity(workload, capacity, options)  # names the pool to raise before admission sizes it
    if cases_in_flight is not None:
        options = admission_options(
            workload, capacity, options, cases_in_flight, max_active_shards=admission_max_active_shards
        )
    plan = plan_capacity(workload, capacity, options, deadline_seconds=seconds, search=search)
    main = plan.outcomes.get("critical_path")
    view = admission_view(
        workload,
        capacity,
        options,
        ms_per_task_instance=options.scheduler_ms_per_task_instance,
        simulated=main.result if main is not None else None,
        configured_target=cases_in_flight or 0,
    )
    written = None
    if plot is not None:
        from avsim.planner.plot import write_progress_plot

        written = write_progress_plot(plan, plot)
    if as_json:
        doc = plan_to_json(plan)
        doc["admission"] = admission_to_json(view)
        text = json.dumps(doc, indent=2, default=str)
    else:
        extra = format_admission(view, ms_setting=ms_setting, per_loop_setting=per_loop_setting)
        text = "\n".join([format_table(plan), "", *extra]) + (f"\nplot: {written}" if written else "")
    return PlanOutput(plan, text, written)


def admission_to_json(view: AdmissionView) -> dict[str, object]:
    feed = view.feed
    sim = view.simulated
    return {
        "admitting": view.admitting,
        "cases_in_flight": view.cases_in_flight,
        "littles_law_cases": view.load.littles_law_cases(view.pools),
        "phase_starts_per_second": feed.starts_per_second,
        "task_instances_in_flight": feed.task_instances,
        "loop_seconds": feed.loop_seconds,
        "starts_per_loop": feed.starts_per_loop,
        "max_per_loop": feed.max_per_loop,
        "max_starts_per_second": feed.max_starts_per_second,
        "scheduler_can_feed": feed.can_feed,
        "simulated_peak_task_instances": sim.peak_task_instances if sim else None,
        "simulated_twin_share": sim.twin_share if sim else None,
        "simulated_mean_loop_seconds": sim.mean_loop_seconds if sim else None,
    }


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


def configured_scheduler() -> tuple[float, int]:
    """``[avsim] scheduler_ms_per_task_instance`` and ``[scheduler] max_tis_per_query`` (0 there
    means ``[core] parallelism``, as the scheduler reads it)."""
    from avsim.settings import OPTIONS, airflow_config

    key = "scheduler_ms_per_task_instance"
    try:
        ms = float(airflow_config("avsim", key, OPTIONS[key][0]))
        per_loop = int(airflow_config("scheduler", "max_tis_per_query", "16"))
        if per_loop == 0:
            per_loop = int(airflow_config("core", "parallelism", "32"))
    except ValueError as exc:
        raise PlannerError(f"a scheduler setting has the wrong type: {exc}") from None
    if not 0 <= ms <= 10_000:
        raise PlannerError(f"[avsim] {key} = {ms}; use milliseconds in [0, 10000]")
    return ms, max(1, per_loop)
