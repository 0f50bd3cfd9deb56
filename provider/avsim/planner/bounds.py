"""What no schedule can beat, the fewest GPUs that meet a deadline, and a quick estimate of time left.

- :func:`lower_bound`: ``max(longest case path, GPU work / GPUs, CPU work / CPUs)`` plus the
  run-level phases' path (they start after every case), from the durations the simulation uses;
- :func:`smallest_gpus`: the fewest spot GPUs with which the simulated run ends by a deadline
  (bisection between the bound's answer and a count that is found to meet it);
- :func:`estimate_finish_seconds` / :func:`gpus_for_deadline`: closed forms over the work left,
  for a tracker that re-estimates a run in flight every few minutes without simulating it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from avsim.plan.graph import remaining_path
from avsim.planner.options import Capacity, PlannerError, SimOptions, hangs, phase_duration
from avsim.planner.simulate import simulate
from avsim.planner.workload import PhaseWork, Workload

#: Lower bound / simulated makespan of the critical-path rule, as ``bench/planner.py`` measures it on
#: 10,000 cases at 280 GPUs: 0.99 (1 / 1.009) at S = 250, W = 6 with logical dates on shard runs,
#: 0.92 (1 / 1.085) at S = 250, W = 4 without. The closed forms divide the work bound by it.
DEFAULT_EFFICIENCY = 0.95


@dataclass(frozen=True)
class LowerBound:
    critical_path_seconds: float
    gpu_seconds: float
    cpu_seconds: float
    run_phase_seconds: float
    gpus: int
    cpus: int

    @property
    def gpu_bound_seconds(self) -> float:
        if not self.gpu_seconds:
            return 0.0
        return self.gpu_seconds / self.gpus if self.gpus else math.inf

    @property
    def cpu_bound_seconds(self) -> float:
        if not self.cpu_seconds:
            return 0.0
        return self.cpu_seconds / self.cpus if self.cpus else math.inf

    @property
    def seconds(self) -> float:
        return (
            max(self.critical_path_seconds, self.gpu_bound_seconds, self.cpu_bound_seconds)
            + self.run_phase_seconds
        )

    @property
    def binding(self) -> str:
        """Which term sets the bound: ``critical path``, ``GPU work`` or ``CPU work``."""
        terms = {
            "critical path": self.critical_path_seconds,
            "GPU work": self.gpu_bound_seconds,
            "CPU work": self.cpu_bound_seconds,
        }
        return max(terms, key=lambda k: terms[k])


def _path(phases: tuple[PhaseWork, ...], seconds: list[float]) -> float:
    if not phases:
        return 0.0
    names = [p.name for p in phases]
    deps = {p.name: [u for u in p.upstream if u in names] for p in phases}
    return max(remaining_path(deps, dict(zip(names, seconds, strict=True))).values())


def lower_bound(workload: Workload, capacity: Capacity, options: SimOptions | None = None) -> LowerBound:
    """The bound for ``workload`` on ``capacity``, with the durations the simulation would use
    (numbered as it numbers tasks: cases in order, their phases in order, then run-level phases)."""
    options = options or SimOptions()
    # Every phase's overhead lengthens the paths; the part in its slots also the pools' work.
    extra, held = options.phase_overhead_seconds, options.held_overhead_seconds
    t = 0
    longest = gpu = cpu = 0.0
    cache: dict[int, float] = {}
    for case in workload.cases:
        work = [phase_duration(p.seconds, t + i, options) for i, p in enumerate(case.phases)]
        seconds = [w + extra for w in work]
        t += len(case.phases)
        if options.duration_spread:
            path = _path(case.phases, seconds)
        else:
            path = cache.get(id(case.phases), -1.0)
            if path < 0:
                path = cache[id(case.phases)] = _path(case.phases, seconds)
        longest = max(longest, path)
        for i, (p, w) in enumerate(zip(case.phases, work, strict=True)):
            if p.is_gpu:
                gpu += (w + held) * p.gpus
                if hangs(t - len(case.phases) + i, 0, p.gpus, options):  # its hung attempt's slots
                    gpu += (options.lease_seconds + held) * p.gpus
            else:
                cpu += w + held
    run_seconds = [
        phase_duration(p.seconds, t + i, options) + extra for i, p in enumerate(workload.run_phases)
    ]
    return LowerBound(
        critical_path_seconds=longest,
        gpu_seconds=gpu,
        cpu_seconds=cpu,
        run_phase_seconds=_path(workload.run_phases, run_seconds),
        gpus=capacity.total_gpus,
        cpus=capacity.cpus,
    )


@dataclass(frozen=True)
class GpuSearch:
    deadline_seconds: float
    #: The fewest spot GPUs found to meet the deadline; None when no count does.
    gpus: int | None
    makespan_seconds: float | None
    #: Why no count meets it (when ``gpus`` is None).
    reason: str
    #: (spot GPUs, simulated makespan or inf past the deadline), in the order simulated.
    tried: tuple[tuple[int, float], ...]


def smallest_gpus(
    workload: Workload,
    capacity: Capacity,
    options: SimOptions,
    deadline_seconds: float,
    *,
    max_gpus: int = 100_000,
) -> GpuSearch:
    """The fewest spot GPUs (CPUs and on-demand GPUs as in ``capacity``) for which the simulated
    run ends within ``deadline_seconds``. Counts below the lower bound's answer are not simulated;
    above it, the count is raised by 10 % until one meets the deadline, then bisected."""
    if deadline_seconds <= 0:
        raise PlannerError(f"deadline is {deadline_seconds:.0f} s after the start; give a later deadline")
    bound = lower_bound(workload, capacity, options)
    tried: list[tuple[int, float]] = []

    def none(reason: str) -> GpuSearch:
        return GpuSearch(deadline_seconds, None, None, reason, tuple(tried))

    fixed = max(bound.critical_path_seconds, bound.cpu_bound_seconds) + bound.run_phase_seconds
    if fixed > deadline_seconds:
        if bound.cpu_bound_seconds > bound.critical_path_seconds:
            what, fix = f"the CPU work on {capacity.cpus} CPU slots", "; raise --cpus"
        else:
            what, fix = "the longest case", ""
        return none(
            f"{what} alone takes {fixed / 3600:.1f} h (run-level phases included): no GPU count meets "
            f"a {deadline_seconds / 3600:.1f} h deadline{fix}"
        )
    widest = max((p.gpus for c in workload.cases for p in c.phases), default=0)
    widest = max([widest, *(p.gpus for p in workload.run_phases)])
    room = deadline_seconds - bound.run_phase_seconds
    lo = max(1, widest, math.ceil(bound.gpu_seconds / room) - capacity.on_demand_gpus)
    makespans: dict[int, float] = {}

    def meets(g: int) -> bool:
        if g not in makespans:
            result = simulate(workload, replace(capacity, gpus=g), options, stop_after=deadline_seconds)
            makespans[g] = result.makespan_seconds
            tried.append((g, result.makespan_seconds))
        return makespans[g] <= deadline_seconds

    g = lo
    while not meets(g):
        if g >= max_gpus:
            return none(f"even {max_gpus} spot GPUs do not meet the deadline (shard windows, tails)")
        lo = g + 1
        g = min(max_gpus, max(lo, math.ceil(g * 1.1)))
    hi = g
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return GpuSearch(deadline_seconds, hi, makespans[hi], "", tuple(tried))


@dataclass(frozen=True)
class WorkLeft:
    """What a run still has to do, in the terms of the closed-form estimates."""

    gpu_seconds: float
    cpu_seconds: float
    #: The longest remaining path of any case.
    path_seconds: float
    #: The run-level phases' path (they start once every case has ended).
    run_phase_seconds: float = 0.0

    @classmethod
    def of(cls, workload: Workload) -> WorkLeft:
        b = lower_bound(workload, Capacity(gpus=1, cpus=1))
        return cls(b.gpu_seconds, b.cpu_seconds, b.critical_path_seconds, b.run_phase_seconds)


def estimate_finish_seconds(
    work: WorkLeft, capacity: Capacity, efficiency: float = DEFAULT_EFFICIENCY
) -> float:
    """Seconds until the run ends: the lower bound with the work terms divided by ``efficiency``
    (the share of the bound a real schedule reaches; see :data:`DEFAULT_EFFICIENCY`)."""
    if not 0 < efficiency <= 1:
        raise PlannerError(f"efficiency = {efficiency}: use a value in (0, 1]")
    gpu = (
        work.gpu_seconds / capacity.total_gpus
        if capacity.total_gpus
        else (math.inf if work.gpu_seconds else 0)
    )
    cpu = work.cpu_seconds / capacity.cpus if capacity.cpus else (math.inf if work.cpu_seconds else 0)
    return max(work.path_seconds, max(gpu, cpu) / efficiency) + work.run_phase_seconds


def gpus_for_deadline(
    work: WorkLeft,
    seconds_left: float,
    cpus: int,
    on_demand_gpus: int = 0,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> int | None:
    """The fewest spot GPUs with which :func:`estimate_finish_seconds` is within ``seconds_left``;
    None when no GPU count is enough (the longest path or the CPU work alone takes longer)."""
    room = seconds_left - work.run_phase_seconds
    cpu = work.cpu_seconds / cpus / efficiency if cpus else (math.inf if work.cpu_seconds else 0.0)
    if room <= 0 or work.path_seconds > room or cpu > room:
        return None
    if not work.gpu_seconds:
        return 0
    return max(1, math.ceil(work.gpu_seconds / (room * efficiency)) - on_demand_gpus)
