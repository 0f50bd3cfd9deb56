"""The planner's inputs besides the workload: capacity, the run's shape, failure models; checked once."""

from __future__ import annotations

from dataclasses import dataclass

from avsim.errors import AvsimError

#: The orderings the planner compares. ``critical_path``: avsim's rule (:mod:`avsim.priority`);
#: ``downstream``: Airflow's default ``weight_rule`` (1 + tasks downstream); ``fifo``: the order
#: phases became ready in.
STRATEGIES = ("critical_path", "downstream", "fifo")

_MASK = (1 << 64) - 1


class PlannerError(AvsimError):
    """The planner cannot simulate what it was given (capacity a phase could never get, bad options)."""


@dataclass(frozen=True)
class Capacity:
    """Slots of the three pools: GPU phases run on spot GPUs (``pool_slots`` = their GPUs) and
    move to on-demand GPUs after ``on_demand_after_preemptions``; a CPU phase takes one CPU slot."""

    gpus: int
    cpus: int
    on_demand_gpus: int = 0

    def __post_init__(self) -> None:
        for label, value in (
            ("gpus", self.gpus),
            ("cpus", self.cpus),
            ("on_demand_gpus", self.on_demand_gpus),
        ):
            if value < 0:
                raise PlannerError(f"capacity: {label} = {value}; use 0 or more")

    @property
    def total_gpus(self) -> int:
        return self.gpus + self.on_demand_gpus


@dataclass(frozen=True)
class SimOptions:
    """How the run is shaped and what goes wrong in it. Defaults: the ``[avsim]`` defaults, no failures."""

    strategy: str = "critical_path"
    #: S: most cases per shard run; W: most shard runs active (the next starts when one ends).
    shard_size: int = 250
    max_active_shards: int = 4
    #: Spot preemptions per GPU-hour on the spot pool (Poisson), e.g. 0.05 for 5 %/hour.
    preemption_rate: float = 0.0
    #: Work between two checkpoints of a checkpointing phase; a preempted or crashed attempt of such
    #: a phase resumes from its last checkpoint, any other attempt starts over.
    checkpoint_seconds: float = 300.0
    #: Probability that an attempt fails for an infrastructure reason (retried within its budget).
    failure_rate: float = 0.0
    #: Each phase's duration is its estimate times a factor drawn uniformly in [1 - spread, 1 + spread].
    duration_spread: float = 0.0
    #: From a window slot freeing to the next shard run's first phases being ready (trigger poll,
    #: ``load_shard``, expansion).
    shard_start_seconds: float = 0.0
    #: From the last shard run's end to the run-level phases being ready (``summarize``, the
    #: parent's poll, ``close_week``).
    run_phases_start_seconds: float = 0.0
    #: Shard runs created with increasing logical dates (what ``ShardRunOperator`` does): Airflow then
    #: orders equal weights by shard (oldest first) before map index. ``False`` models shard runs
    #: triggered without a logical date: equal weights ordered by map index across all active shards.
    shard_logical_dates: bool = True
    #: The shard DAG's ``max_active_tasks`` (per DAG run); ``None``: no limit.
    max_active_tasks_per_shard: int | None = None
    #: ``[core] parallelism``: most phases running at once across every pool; ``None``: no limit.
    parallelism: int | None = None
    #: What the orchestrator adds to every attempt of a phase, in wall seconds, on top of its work:
    #: from the upstream phase's end to this phase's process starting (scheduler loop, queueing, the
    #: task process, parsing) plus the fixed cost around its own work (ledger, commit). Measured by
    #: ``bench/planner_forecast.py``; 0 (the default) leaves forecasts as they were, and 30-minute
    #: phases barely notice a few seconds.
    phase_overhead_seconds: float = 0.0
    #: Of ``phase_overhead_seconds``, the part during which the attempt holds its slots (queued ->
    #: ended, beyond its work); the rest is latency before it is queued, holding nothing. ``None``:
    #: all of it.
    phase_overhead_in_slot_seconds: float | None = None
    #: Seed of every random draw (preemptions, failures, durations): same seed, same run.
    seed: int = 0
    #: Admission by cases in flight: ``None`` is the window of whole shard runs (a shard run is
    #: admitted when one of the W active ends, what runs today); a number N admits the next shard run
    #: as soon as fewer than N cases are unfinished (never below N while cases wait, at most W shard
    #: runs active; one is always admitted when none is). See :mod:`avsim.plan.inflight`.
    cases_in_flight: int | None = None
    #: The scheduler's loop: milliseconds per unfinished phase task instance of the active shard runs
    #: (``[avsim] scheduler_ms_per_task_instance``). Above 0, a phase that becomes ready is queued at
    #: the end of the first loop that starts after it, loops run back to back, and one loop queues at
    #: most ``max_tis_per_loop``. 0 (the default): no loop, a ready phase is queued at once.
    scheduler_ms_per_task_instance: float = 0.0
    #: ``[scheduler] max_tis_per_query``: the most task instances one loop queues.
    max_tis_per_loop: int = 16
    #: The tails of a real week. ``hang_share``: share of GPU phases whose first attempt hangs, holding
    #: its slots without progress until its lease expires (``lease_seconds`` after its work began),
    #: then fails as infrastructure (retried after the policy's delay). ``slow_share``: share of
    #: phases that take ``slow_factor`` x their estimate (a slow node). Retry backoff is the failure
    #: policy's own (``failure_rate``).
    hang_share: float = 0.0
    lease_seconds: float = 600.0
    slow_share: float = 0.0
    slow_factor: float = 3.0

    def __post_init__(self) -> None:
        problems = []
        if self.strategy not in STRATEGIES:
            problems.append(f"strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}")
        if self.shard_size < 1:
            problems.append(f"shard_size = {self.shard_size}: use 1 or more")
        if self.max_active_shards < 1:
            problems.append(f"max_active_shards = {self.max_active_shards}: use 1 or more")
        if not 0 <= self.preemption_rate <= 10_000:
            problems.append(
                f"preemption_rate = {self.preemption_rate}: use a rate per GPU-hour in [0, 10000]"
            )
        if self.checkpoint_seconds <= 0:
            problems.append(f"checkpoint_seconds = {self.checkpoint_seconds}: use a positive interval")
        if not 0 <= self.failure_rate < 1:
            problems.append(f"failure_rate = {self.failure_rate}: use a probability in [0, 1)")
        if not 0 <= self.duration_spread < 1:
            problems.append(f"duration_spread = {self.duration_spread}: use a value in [0, 1)")
        if self.shard_start_seconds < 0:
            problems.append(f"shard_start_seconds = {self.shard_start_seconds}: use 0 or more")
        if self.run_phases_start_seconds < 0:
            problems.append(f"run_phases_start_seconds = {self.run_phases_start_seconds}: use 0 or more")
        if self.max_active_tasks_per_shard is not None and self.max_active_tasks_per_shard < 1:
            problems.append(f"max_active_tasks_per_shard = {self.max_active_tasks_per_shard}: use 1 or more")
        if self.parallelism is not None and self.parallelism < 1:
            problems.append(f"parallelism = {self.parallelism}: use 1 or more")
        if not 0 <= self.phase_overhead_seconds <= 86_400:
            problems.append(
                f"phase_overhead_seconds = {self.phase_overhead_seconds}: use seconds in [0, 86400]"
            )
        held = self.phase_overhead_in_slot_seconds
        if held is not None and not 0 <= held <= self.phase_overhead_seconds:
            problems.append(
                f"phase_overhead_in_slot_seconds = {held}: use seconds in [0, phase_overhead_seconds = "
                f"{self.phase_overhead_seconds}]"
            )
        if self.cases_in_flight is not None and self.cases_in_flight < 1:
            problems.append(f"cases_in_flight = {self.cases_in_flight}: use 1 or more (or None: the window)")
        if not 0 <= self.scheduler_ms_per_task_instance <= 10_000:
            problems.append(
                f"scheduler_ms_per_task_instance = {self.scheduler_ms_per_task_instance}: use [0, 10000]"
            )
        if self.max_tis_per_loop < 1:
            problems.append(f"max_tis_per_loop = {self.max_tis_per_loop}: use 1 or more")
        for label, share in (("hang_share", self.hang_share), ("slow_share", self.slow_share)):
            if not 0 <= share <= 1:
                problems.append(f"{label} = {share}: use a share in [0, 1]")
        if self.lease_seconds <= 0:
            problems.append(f"lease_seconds = {self.lease_seconds}: use a positive number of seconds")
        if self.slow_factor < 1:
            problems.append(f"slow_factor = {self.slow_factor}: use 1 or more")
        if problems:
            raise PlannerError("planner options rejected: " + "; ".join(problems))

    @property
    def held_overhead_seconds(self) -> float:
        """The part of the per-phase overhead an attempt holds its slots for."""
        held = self.phase_overhead_in_slot_seconds
        return self.phase_overhead_seconds if held is None else held


def _mix(x: int) -> int:
    """One splitmix64 step: advance by the golden-ratio increment, then finalize."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def unit(seed: int, a: int, b: int, salt: int) -> float:
    """A uniform draw in [0, 1) fixed by its arguments (splitmix64, each argument mixed in turn).

    Keyed by task and attempt rather than drawn from one stream, so two simulations of the same
    workload face the same preemptions and failures whatever their strategy or capacity."""
    x = _mix(_mix(_mix(_mix(seed & _MASK) ^ salt) ^ (a & _MASK)) ^ (b & _MASK))
    return (x >> 11) / float(1 << 53)


#: Salts of the draws, one per purpose.
SALT_DURATION, SALT_PREEMPT, SALT_FAIL, SALT_FAIL_AT, SALT_SLOW, SALT_HANG = 1, 2, 3, 4, 5, 6


def phase_duration(seconds: float, task: int, options: SimOptions) -> float:
    """The duration the simulation uses for task number ``task``: its estimate, spread if asked, and
    ``slow_factor`` times that for the ``slow_share`` of phases on a slow node."""
    if options.duration_spread:
        u = unit(options.seed, task, 0, SALT_DURATION)
        seconds *= 1.0 + options.duration_spread * (2.0 * u - 1.0)
    if options.slow_share and unit(options.seed, task, 0, SALT_SLOW) < options.slow_share:
        seconds *= options.slow_factor
    return seconds


def hangs(task: int, attempt: int, gpus: int, options: SimOptions) -> bool:
    """Whether attempt ``attempt`` (0 the first) of task number ``task`` hangs until its lease expires:
    the first attempt of ``hang_share`` of the GPU phases."""
    return bool(
        options.hang_share
        and gpus
        and attempt == 0
        and unit(options.seed, task, attempt, SALT_HANG) < options.hang_share
    )
