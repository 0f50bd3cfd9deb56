"""How many cases a week keeps in flight, and what that costs the scheduler: pure functions.

The target: by Little's law, the binding pool's case rate times a case's end-to-end time, times
:data:`HEADROOM`, and at least the cases the scheduler carries comfortably (:func:`comfortable_cases`);
``[avsim] cases_in_flight`` overrides it. :func:`scheduler_feed` says whether one scheduler loop can
queue the phase starts the pools need. Nothing here imports Airflow or reads settings
(docs/design.md, "Admission by cases in flight (the default)").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from avsim.errors import AvsimError
from avsim.plan.graph import remaining_path

#: Target cases in flight / the Little's-law minimum (:attr:`CaseLoad.littles_law_cases`). Measured by
#: ``bench/planner.py`` (section 4: 10,000 sample cases, 280 spot GPUs, 200 CPU slots, S = 250, W = 6):
#: the smallest factor of the sweep whose makespan is within 1 % of the lower bound (1.009; 1.75 gave
#: 1.015, 1.5 gave 1.040).
HEADROOM = 2.0

#: Airflow's default ``[scheduler] max_tis_per_query``: the most task instances one loop queues.
DEFAULT_MAX_TIS_PER_LOOP = 16

#: The shortest loop the planner assumes (a loop with nothing to evaluate still makes its queries).
MIN_LOOP_SECONDS = 0.1


class AdmissionError(AvsimError):
    """The figures given cannot size admission (no slots for a pool some phase needs, bad settings)."""


@dataclass(frozen=True)
class PhaseLoad:
    """One phase of a case as admission sees it."""

    name: str
    upstream: tuple[str, ...]
    #: GPUs it holds; 0 for a CPU phase (one CPU slot).
    gpus: int
    seconds: float
    #: Its task has an on-demand twin task instance (a GPU phase with a preemption budget).
    twin: bool = False

    @property
    def task_instances(self) -> int:
        return 2 if self.twin else 1


@dataclass(frozen=True)
class Pools:
    spot_gpus: int
    cpus: int
    on_demand_gpus: int = 0
    #: ``[core] parallelism``: most phases running at once whatever their pool; ``None``: no limit.
    parallelism: int | None = None

    def __post_init__(self) -> None:
        if min(self.spot_gpus, self.cpus, self.on_demand_gpus) < 0:
            raise AdmissionError(f"pools {self}: slots must be 0 or more")
        if self.parallelism is not None and self.parallelism < 1:
            raise AdmissionError(f"parallelism = {self.parallelism}: use 1 or more")


@dataclass(frozen=True)
class CaseLoad:
    """The mean case of a week, in the terms admission needs."""

    cases: int
    #: GPU-seconds (GPUs x seconds) and CPU-seconds per case: the work and the part of each phase's
    #: overhead it holds its slots for.
    gpu_seconds: float
    cpu_seconds: float
    #: End to end, alone: the longest path through its phases, each with its per-phase overhead.
    path_seconds: float
    phases: float
    #: Phase task instances per case (a twin is one more).
    task_instances: float
    #: Of them, on-demand twins.
    twin_task_instances: float
    #: Seconds its phases run, each counted once whatever its GPUs (what ``[core] parallelism`` caps).
    slot_seconds: float = 0.0

    @classmethod
    def of_cases(
        cls,
        cases: Iterable[Sequence[PhaseLoad]],
        *,
        phase_overhead_seconds: float = 0.0,
        held_overhead_seconds: float | None = None,
    ) -> CaseLoad:
        """The mean over ``cases`` (each: its phases): every phase's path lengthened by the overhead,
        its slots held for ``held_overhead_seconds`` of it beyond its work (default: all of it), as
        the planner's simulation and lower bound count them."""
        held = phase_overhead_seconds if held_overhead_seconds is None else held_overhead_seconds
        n = 0
        gpu = cpu = path = phases = tis = twins = running = 0.0
        paths: dict[int, float] = {}
        for case in cases:
            n += 1
            for p in case:
                if p.gpus:
                    gpu += (p.seconds + held) * p.gpus
                else:
                    cpu += p.seconds + held
                running += p.seconds + held
            phases += len(case)
            tis += sum(p.task_instances for p in case)
            twins += sum(1 for p in case if p.twin)
            found = paths.get(id(case))
            if found is None:
                found = paths[id(case)] = _path(case, phase_overhead_seconds)
            path += found
        if not n:
            raise AdmissionError("no cases: nothing to admit")
        return cls(n, gpu / n, cpu / n, path / n, phases / n, tis / n, twins / n, running / n)

    def case_rate(self, pools: Pools) -> float:
        """Cases a second when the binding pool is full (:func:`binding_pool` names it)."""
        return min(_rates(self, pools).values())

    def littles_law_cases(self, pools: Pools) -> float:
        """Cases in flight that would keep the binding pool full if no phase ever waited."""
        return self.case_rate(pools) * self.path_seconds


def _path(case: Sequence[PhaseLoad], overhead: float) -> float:
    names = {p.name for p in case}
    deps = {p.name: [u for u in p.upstream if u in names] for p in case}
    seconds = {p.name: p.seconds + overhead for p in case}
    return max(remaining_path(deps, seconds).values(), default=0.0)


def _rates(load: CaseLoad, pools: Pools) -> dict[str, float]:
    rates = {}
    if load.gpu_seconds:
        if not pools.spot_gpus:
            raise AdmissionError("cases have GPU phases and the spot GPU pool has no slots")
        rates["GPU"] = pools.spot_gpus / load.gpu_seconds
    if load.cpu_seconds:
        if not pools.cpus:
            raise AdmissionError("cases have CPU phases and the CPU pool has no slots")
        rates["CPU"] = pools.cpus / load.cpu_seconds
    if pools.parallelism is not None and load.slot_seconds:
        rates["executor"] = pools.parallelism / load.slot_seconds
    if not rates:
        raise AdmissionError("cases have no work: nothing sets a pace")
    return rates


def binding_pool(load: CaseLoad, pools: Pools) -> str:
    """``GPU``, ``CPU`` or ``executor`` (``[core] parallelism``): what is full first."""
    rates = _rates(load, pools)
    return min(rates, key=lambda k: rates[k])


#: The scheduler loop a week's cases in flight may cost before admission holds any back (seconds):
#: Airflow's scheduler heartbeat, so a phase that becomes ready waits at most about one heartbeat for
#: the loop that queues it. Below the cases that fill it (:func:`comfortable_cases`) a week is not
#: throttled, and every week keeps at least that many in flight: with few GPUs, Little's law alone
#: admits so few cases that no GPU phase of the week waits in front of the pool, and a lower class
#: takes the slots its priority should have kept; and a case counts as finished only when its last,
#: lowest-ranked phase ends, so a small target refills in waves (docs/design.md, "Admission by cases
#: in flight").
COMFORTABLE_LOOP_SECONDS = 5.0


def comfortable_cases(load: CaseLoad, ms_per_task_instance: float) -> int:
    """Cases whose task instances keep the scheduler's loop within :data:`COMFORTABLE_LOOP_SECONDS` at
    ``ms_per_task_instance`` (``[avsim] scheduler_ms_per_task_instance``); 0 when that is not known."""
    if ms_per_task_instance <= 0 or load.task_instances <= 0:
        return 0
    task_instances = COMFORTABLE_LOOP_SECONDS * 1000.0 / ms_per_task_instance
    return max(1, int(task_instances / load.task_instances))


def target_cases_in_flight(
    load: CaseLoad, pools: Pools, *, configured: int = 0, headroom: float = HEADROOM, floor: int = 0
) -> int:
    """The unfinished cases a week keeps in flight: ``configured`` when above 0 (``[avsim]
    cases_in_flight``), else ``headroom`` x the Little's-law figure, rounded up, and at least ``floor``
    (:func:`comfortable_cases`); never more than the week's cases, never below 1."""
    if configured < 0:
        raise AdmissionError(f"cases_in_flight = {configured}: use 0 (derive) or more")
    if headroom < 1:
        raise AdmissionError(f"headroom = {headroom}: use 1 or more")
    if configured:
        return configured
    derived = math.ceil(headroom * load.littles_law_cases(pools))
    return max(1, min(load.cases, max(derived, floor)))


#: Shard runs of more than this share of the target are too coarse to follow it: each one admitted
#: takes the week up to a shard run above the target, which the scheduler's loop carries.
COARSE_SHARE = 0.5


def coarse_shard_runs(shard_size: int, cases_in_flight: int) -> bool:
    """Shard runs too large for admission to follow ``cases_in_flight``: each admitted takes the week
    up to ``shard_size`` (more than :data:`COARSE_SHARE` of the target) above it, and with a shard run
    larger than the target the loop carries a whole shard run, not the target."""
    return shard_size > COARSE_SHARE * cases_in_flight


def phase_starts_per_second(load: CaseLoad, pools: Pools) -> float:
    """Phase attempts a second the pools need at full occupancy (the binding pool full, the other
    as busy as the cases it feeds), without retries."""
    return load.case_rate(pools) * load.phases


def loop_seconds(task_instances: float, ms_per_task_instance: float) -> float:
    """Airflow 3.3's scheduler loop with ``task_instances`` unfinished phase task instances in the
    active runs, at ``ms_per_task_instance`` each (at least :data:`MIN_LOOP_SECONDS`)."""
    if ms_per_task_instance < 0 or task_instances < 0:
        raise AdmissionError("task instances and milliseconds per task instance must be 0 or more")
    return max(MIN_LOOP_SECONDS, task_instances * ms_per_task_instance / 1000.0)


@dataclass(frozen=True)
class SchedulerFeed:
    """Whether the scheduler keeps up with the pools at a number of cases in flight."""

    cases_in_flight: int
    #: Unfinished phase task instances at that count (every case's all: the most, at admission).
    task_instances: float
    loop_seconds: float
    starts_per_second: float
    #: The most task instances one loop queues (``[scheduler] max_tis_per_query``).
    max_per_loop: int

    @property
    def starts_per_loop(self) -> float:
        """Phase starts the pools need during one loop."""
        return self.starts_per_second * self.loop_seconds

    @property
    def load(self) -> float:
        """Starts needed per loop / starts one loop queues: above 1 the scheduler cannot feed the pools."""
        return self.starts_per_loop / self.max_per_loop

    @property
    def max_starts_per_second(self) -> float:
        """The most phases a second the scheduler queues at this loop: ``max_per_loop / loop``."""
        return self.max_per_loop / self.loop_seconds

    @property
    def can_feed(self) -> bool:
        return self.load <= 1.0


def scheduler_feed(
    load: CaseLoad,
    pools: Pools,
    cases_in_flight: int,
    *,
    ms_per_task_instance: float,
    max_per_loop: int = DEFAULT_MAX_TIS_PER_LOOP,
) -> SchedulerFeed:
    """The scheduler's loop at ``cases_in_flight`` and whether it can queue the starts the pools need.

    The loop carries every unfinished task instance of the cases in flight (at most all of each
    case's, :attr:`CaseLoad.task_instances`); one loop queues at most ``max_per_loop``. So the pools
    starve when ``starts/s x loop > max_per_loop``, whatever the slots."""
    if max_per_loop < 1:
        raise AdmissionError(f"max_per_loop = {max_per_loop}: use 1 or more")
    tis = cases_in_flight * load.task_instances
    return SchedulerFeed(
        cases_in_flight=cases_in_flight,
        task_instances=tis,
        loop_seconds=loop_seconds(tis, ms_per_task_instance),
        starts_per_second=phase_starts_per_second(load, pools),
        max_per_loop=max_per_loop,
    )
