"""The critical-path priority rule, and the Airflow priority weight strategies that apply it.

A phase's weight is its run class's base plus the remaining critical path of its case
from that phase (in minutes, capped below the gap between bases)::

    weight = base(run class, run id) + path(remaining seconds)

- bases: a canary shard run (:func:`avsim.artifacts.canary_run_id`) > the weekly run > ad-hoc runs;
  every gap is larger than :data:`MAX_PATH_WEIGHT`, so any weekly phase outranks any ad-hoc
  phase and any canary phase outranks both, whatever their paths;
- path: the longer the case still has to go, the earlier the phase runs. A case's later
  phases weigh less than its earlier ones only by path, so cases flow through their phases
  depth-first instead of every first phase running before any second one (Airflow's default
  ``downstream`` rule), GPU and CPU phases overlap, and finished cases appear from the first hour.

Airflow evaluates a strategy in the scheduler when it creates, expands or clears task
instances (not on an automatic retry), and the strategy only sees the serialized task: its
``priority_weight``, ``task_id``, ``dag_id`` and the instance's ``run_id`` and ``map_index``.
Strategies are stateless (Airflow stores only the class's import path), so each run class is a
subclass with a class attribute. The path part therefore travels in the task's own
``priority_weight``: the DAG builder sets ``priority_weight=path_weight(remaining seconds)`` and
``weight_rule=WeeklyCriticalPathPriority()`` (or the ad-hoc one) on every phase task.

A strategy class must be registered through ``AirflowPlugin.priority_weight_strategies``
(:data:`STRATEGIES`, listed by :class:`avsim.plugin.AvsimPlugin`): DAG serialization refuses an
unregistered class, and the scheduler could not load it back.

:func:`critical_path_priority` is the one rule: the strategies call it with what the scheduler
sees, and the capacity planner (:mod:`avsim.planner`) with the plan's durations, so the planner
simulates the very ordering the scheduler applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.task.priority_strategy import PriorityWeightStrategy

from avsim.artifacts import is_canary_run
from avsim.manifest.models import DEFAULT_BASE_PRIORITY, RunClass
from avsim.plan.build import MAX_PATH_WEIGHT, WEIGHT_PER_MINUTE, phase_weight

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

__all__ = [
    "ADHOC_BASE",
    "CANARY_BASE",
    "MAX_PATH_WEIGHT",
    "STRATEGIES",
    "WEEKLY_BASE",
    "WEIGHT_PER_MINUTE",
    "AdhocCriticalPathPriority",
    "WeeklyCriticalPathPriority",
    "critical_path_priority",
    "path_weight",
    "phase_priority",
    "run_base",
    "strategy_for",
]

#: Base of the weekly run's phases.
WEEKLY_BASE: int = DEFAULT_BASE_PRIORITY[RunClass.WEEKLY]
#: Base of ad-hoc runs' phases: below every weekly phase.
ADHOC_BASE: int = DEFAULT_BASE_PRIORITY[RunClass.ADHOC]
#: Base of a canary shard run's phases: above every weekly phase (the canary gates the week).
CANARY_BASE: int = 2 * WEEKLY_BASE

_BASES = {RunClass.WEEKLY: WEEKLY_BASE, RunClass.ADHOC: ADHOC_BASE}

# The rule's invariant: the path part never bridges the gap between two run classes.
if not (CANARY_BASE - WEEKLY_BASE > MAX_PATH_WEIGHT and WEEKLY_BASE - ADHOC_BASE > MAX_PATH_WEIGHT):
    raise RuntimeError(
        f"priority bases {CANARY_BASE}/{WEEKLY_BASE}/{ADHOC_BASE} are closer than MAX_PATH_WEIGHT "
        f"({MAX_PATH_WEIGHT}): a long ad-hoc path would outrank a weekly phase; widen the bases"
    )


def path_weight(remaining_seconds: float) -> int:
    """The path part of a phase's weight: its case's remaining critical path from the phase
    (the phase included), in whole minutes, at least 1 and at most :data:`MAX_PATH_WEIGHT`.

    This is what the DAG builder puts in a phase task's ``priority_weight``."""
    return phase_weight(0, remaining_seconds)


def run_base(run_class: RunClass | str, run_id: str | None = None) -> int:
    """The base weight of a run: :data:`CANARY_BASE` for a canary shard run, else its class's."""
    if is_canary_run(run_id):
        return CANARY_BASE
    return _BASES[RunClass(run_class)]


def critical_path_priority(base: int, path: int) -> int:
    """The rule: ``base + path``, the path part clamped to ``[0, MAX_PATH_WEIGHT]`` so that no
    phase, whatever its task's ``priority_weight`` says, crosses into another run class."""
    return base + min(MAX_PATH_WEIGHT, max(0, int(path)))


def phase_priority(run_class: RunClass | str, remaining_seconds: float, run_id: str | None = None) -> int:
    """The weight a phase gets, from its case's remaining critical path in seconds (the planner's entry)."""
    return critical_path_priority(run_base(run_class, run_id), path_weight(remaining_seconds))


class _CriticalPathPriority(PriorityWeightStrategy):
    """Base of the run-class strategies; ``run_class`` is set by each subclass."""

    run_class: ClassVar[RunClass]

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        path = task.priority_weight if task is not None else 1
        return critical_path_priority(run_base(self.run_class, ti.run_id), path)


class WeeklyCriticalPathPriority(_CriticalPathPriority):
    """Weekly run (canary shard runs above it): ``WEEKLY_BASE`` (or ``CANARY_BASE``) + the task's path weight."""

    run_class = RunClass.WEEKLY


class AdhocCriticalPathPriority(_CriticalPathPriority):
    """Ad-hoc runs sharing the weekly pools: ``ADHOC_BASE`` + the task's path weight."""

    run_class = RunClass.ADHOC


#: What the plugin registers (``AirflowPlugin.priority_weight_strategies``).
STRATEGIES: tuple[type[PriorityWeightStrategy], ...] = (WeeklyCriticalPathPriority, AdhocCriticalPathPriority)


def strategy_for(run_class: RunClass | str) -> PriorityWeightStrategy:
    """The strategy instance a DAG's phase tasks take as ``weight_rule``."""
    rc = RunClass(run_class)
    return WeeklyCriticalPathPriority() if rc is RunClass.WEEKLY else AdhocCriticalPathPriority()
