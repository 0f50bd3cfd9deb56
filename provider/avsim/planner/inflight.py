"""The planner's side of admission by cases in flight: the options a plan simulates, and what
``avsim plan`` says about the pools' pace and the scheduler's loop (:mod:`avsim.plan.inflight`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from avsim.plan.admission import admission_shard_size
from avsim.plan.inflight import (
    COMFORTABLE_LOOP_SECONDS,
    HEADROOM,
    CaseLoad,
    Pools,
    SchedulerFeed,
    binding_pool,
    coarse_shard_runs,
    comfortable_cases,
    scheduler_feed,
    target_cases_in_flight,
)
from avsim.planner.options import Capacity, SimOptions
from avsim.planner.result import SimResult
from avsim.planner.workload import Workload


def pools_of(capacity: Capacity, options: SimOptions | None = None) -> Pools:
    return Pools(
        spot_gpus=capacity.gpus,
        cpus=capacity.cpus,
        on_demand_gpus=capacity.on_demand_gpus,
        parallelism=options.parallelism if options is not None else None,
    )


def case_load(workload: Workload, options: SimOptions) -> CaseLoad:
    """The mean case with the orchestrator's cost per phase the simulation uses."""
    return workload.case_load(options.phase_overhead_seconds, options.held_overhead_seconds)


def admission_options(
    workload: Workload,
    capacity: Capacity,
    options: SimOptions,
    cases_in_flight: int,
    *,
    max_active_shards: int | None = None,
) -> SimOptions:
    """``options`` admitting by cases in flight as the weekly run does: ``cases_in_flight`` (0: derived
    from the pools and the workload), shard runs of a third of it, at most ``options.shard_size``
    (:func:`avsim.plan.admission.admission_shard_size`). ``max_active_shards`` caps the active shard runs;
    ``None``: no cap besides the week's shard runs (the cases in flight bind)."""
    load = case_load(workload, options)
    target = target_cases_in_flight(
        load,
        pools_of(capacity, options),
        configured=cases_in_flight,
        floor=comfortable_cases(load, options.scheduler_ms_per_task_instance),
    )
    size = admission_shard_size(len(workload.cases), target, options.shard_size)
    runs = max_active_shards or max(1, math.ceil(len(workload.cases) / size))
    return replace(options, cases_in_flight=target, max_active_shards=runs, shard_size=size)


@dataclass(frozen=True)
class AdmissionView:
    """What ``avsim plan`` prints about admission and the scheduler."""

    load: CaseLoad
    pools: Pools
    #: The cases in flight planned: the target when admitting, else the window's most (W x S).
    cases_in_flight: int
    admitting: bool
    feed: SchedulerFeed
    shard_size: int = 1
    #: The simulated run (critical path), when simulated: what the loop really carried.
    simulated: SimResult | None = None
    #: ``[avsim] cases_in_flight`` set the target.
    configured: bool = False
    ms_per_task_instance: float = 0.0


def admission_view(
    workload: Workload,
    capacity: Capacity,
    options: SimOptions,
    *,
    ms_per_task_instance: float,
    simulated: SimResult | None = None,
    configured_target: int = 0,
) -> AdmissionView:
    load = case_load(workload, options)
    pools = pools_of(capacity, options)
    admitting = options.cases_in_flight is not None
    if options.cases_in_flight is not None:
        cases = options.cases_in_flight
    else:
        cases = min(len(workload.cases), options.shard_size * options.max_active_shards)
    feed = scheduler_feed(
        load, pools, cases, ms_per_task_instance=ms_per_task_instance, max_per_loop=options.max_tis_per_loop
    )
    return AdmissionView(
        load,
        pools,
        cases,
        admitting,
        feed,
        options.shard_size,
        simulated,
        configured=bool(configured_target),
        ms_per_task_instance=ms_per_task_instance,
    )


def admission_target_line(view: AdmissionView, *, ms_per_task_instance: float) -> str:
    """The target ``avsim plan`` will use, and what set it: the configured figure, Little's law over the
    binding pool times the headroom, or the cases the scheduler carries comfortably."""
    load, target = view.load, view.cases_in_flight
    littles = load.littles_law_cases(view.pools)
    derived = math.ceil(HEADROOM * littles)
    floor = comfortable_cases(load, ms_per_task_instance)
    if view.configured:
        why = "[avsim] cases_in_flight"
    elif target >= load.cases and max(derived, floor) >= load.cases:
        why = f"every case of the week: not throttled (Little's law x {HEADROOM:g} = {derived:,}"
        why += f", the scheduler carries {floor:,} comfortably)" if floor else ")"
    elif floor > derived:
        why = (
            f"the {floor:,} cases whose task instances keep the scheduler's loop within "
            f"{COMFORTABLE_LOOP_SECONDS:g} s, above Little's law x {HEADROOM:g} = {derived:,} over the "
            f"{binding_pool(load, view.pools)} pool: the week keeps its own phases queued in front of the pools"
        )
    else:
        why = f"Little's law {littles:,.0f} over the {binding_pool(load, view.pools)} pool x {HEADROOM:g} headroom"
    return f"admission by cases in flight: target {target:,} unfinished cases ({why})"


def format_admission(view: AdmissionView, *, ms_setting: str, per_loop_setting: str) -> list[str]:
    """The lines ``avsim plan`` adds under its table; the last is a warning when the scheduler
    cannot feed the pools (docs/design.md, "Admission by cases in flight")."""
    load, feed = view.load, view.feed
    how = (
        admission_target_line(view, ms_per_task_instance=view.ms_per_task_instance)
        if view.admitting
        else f"window of whole shard runs: up to {view.cases_in_flight:,} cases in flight"
    )
    lines = [
        how,
        f"pools at full occupancy need {feed.starts_per_second:.3f} phase starts per second "
        f"({load.phases:.2f} phases per case, {load.task_instances:.2f} task instances with the "
        "on-demand twins)",
        f"scheduler: expected loop {feed.loop_seconds:.1f} s at {view.cases_in_flight:,} cases in flight "
        f"({feed.task_instances:,.0f} unfinished phase task instances x {ms_setting}); it queues at most "
        f"{feed.max_per_loop} per loop ({per_loop_setting}), the pools need {feed.starts_per_loop:.1f}: "
        f"it starts at most {feed.max_starts_per_second:.2f} phases per second",
    ]
    sim = view.simulated
    if sim is not None and sim.loops:
        lines.append(
            f"simulated loop: mean {sim.mean_loop_seconds:.1f} s, longest {sim.max_loop_seconds:.1f} s; "
            f"unfinished phase task instances at most {sim.peak_task_instances:,}, on average "
            f"{sim.mean_task_instances:,.0f} ({sim.twin_share * 100:.0f} % on-demand twins); "
            f"{sim.peak_active_shard_runs} shard runs active at most"
        )
    shard_size = view.shard_size
    if view.admitting and coarse_shard_runs(shard_size, view.cases_in_flight):
        lines.append(
            f"WARNING: shard runs of {shard_size:,} cases are too coarse for {view.cases_in_flight:,} cases in "
            f"flight: each one admitted takes the week up to {shard_size:,} cases above the target, which "
            f"the scheduler's loop carries; use a shard size of at most "
            f"{max(1, view.cases_in_flight // 2):,} (--shard-size, [avsim] shard_size)"
        )
    if not feed.can_feed:
        lines.append(
            f"WARNING: the scheduler cannot feed the pools: one {feed.loop_seconds:.1f} s loop must queue "
            f"{feed.starts_per_loop:.1f} phases and queues at most {feed.max_per_loop}; fewer cases in "
            "flight, a faster scheduler (more schedulers, a faster metadata database) or a larger "
            "max_tis_per_query"
        )
    return lines
