"""The neutral plan: plain dataclasses between the manifest and Airflow.

Nothing here imports Airflow. The DAG builder turns a :class:`WeeklyPlan` into
DAGs; the planner simulates it; most tests check it and never build an operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from avsim.manifest.models import RunClass

#: The on-demand twin of a GPU phase's task is named ``<phase>_on_demand``.
ON_DEMAND_SUFFIX = "_on_demand"


@dataclass(frozen=True)
class PoolPlan:
    name: str
    description: str
    resource_class: str  # "gpu" | "cpu"
    node_class: str  # "gpu-spot" | "gpu-on-demand" | "cpu"


@dataclass(frozen=True)
class PhasePlan:
    """One phase of a graph family: one Airflow task inside the family's mapped group."""

    name: str
    upstream: tuple[str, ...]
    resource_class: str
    pool: str
    pool_slots: int
    gpus: int
    cpus: float
    memory_bytes: int
    estimated_seconds: float
    timeout_seconds: float
    retries: int
    retry_delay_seconds: float
    retry_backoff: float
    max_retry_delay_seconds: float
    checkpoint: bool
    #: Estimated seconds from this phase's start to the end of its case (this phase included).
    remaining_critical_path_seconds: float
    #: Its weight in a shard run of the plan's run class in the current week (the rule of
    #: :mod:`avsim.plan.priority_rule`); a canary's, a triage or an earlier week's run weighs it otherwise.
    priority_weight: int
    #: The path part alone: what the task carries as ``priority_weight`` for the weight strategy.
    path_weight: int = 1
    preemption_retries: int = 0
    preemption_delay_seconds: float = 10.0
    on_demand_after_preemptions: int = 2
    #: A GPU phase that moves to on-demand nodes after too many preemptions: it gets a twin task
    #: ``<name>_on_demand`` in ``on_demand_pool``.
    on_demand_fallback: bool = False
    on_demand_pool: str = ""
    #: The executor queue of this phase's tasks (``[avsim] gpu_queue`` or ``cpu_queue``); empty: the default.
    queue: str = ""

    @property
    def on_demand_task(self) -> str:
        return f"{self.name}{ON_DEMAND_SUFFIX}"


@dataclass(frozen=True)
class FamilyPlan:
    """Cases sharing one phase graph: one mapped task group, one map index per case."""

    name: str
    group_id: str
    #: Phases in a topological order (the order tasks are created and reported).
    phases: tuple[PhasePlan, ...]
    #: Hash of what shapes the DAG for this graph; a run's graph must match it.
    fingerprint: str
    critical_path_seconds: float

    def phase(self, name: str) -> PhasePlan:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def phase_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.phases)

    @property
    def gpu_seconds_per_case(self) -> float:
        return sum(p.estimated_seconds * p.gpus for p in self.phases)


@dataclass(frozen=True)
class RunPhasePlan:
    """A run-level phase (the weekly summary): after every shard of the week."""

    name: str
    upstream: tuple[str, ...]
    pool: str
    pool_slots: int
    gpus: int
    timeout_seconds: float
    #: The task's retries: the infrastructure and the preemption budgets together.
    retries: int
    retry_delay_seconds: float
    retry_backoff: float
    max_retry_delay_seconds: float
    queue: str = ""
    #: The path part, what the task carries for the weight strategy (as a phase's): the least, since
    #: nothing of its run is behind it.
    path_weight: int = 1


@dataclass(frozen=True)
class WeeklyPlan:
    """What shapes the weekly DAGs. Holds no case: cases reach the mapped groups at run time."""

    families: tuple[FamilyPlan, ...]
    run_phases: tuple[RunPhasePlan, ...]
    pools: tuple[PoolPlan, ...]
    shard_size: int
    max_active_shards: int
    run_class: RunClass = RunClass.WEEKLY
    notes: tuple[str, ...] = field(default=())

    def family(self, name: str) -> FamilyPlan:
        for f in self.families:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def family_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.families)
