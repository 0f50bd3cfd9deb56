"""The critical-path priority rule, and the Airflow priority weight strategies that apply it.

A phase's weight is its run class's base plus the remaining critical path of its case
from that phase (in minutes, capped below the gap between bases)::

    weight = base(run class, run id) + path(remaining seconds)

- bases: a canary shard run (:func:`avsim.artifacts.canary_run_id`) > the weekly run > ad-hoc runs;
  every gap is larger than :data:`MAX_PATH_WEIGHT`, so any weekly phase outranks any ad-hoc
  phase and any canary phase outranks both, whatever their paths;
- an earlier week: once a later week has started (a repair of last week cleared during this week,
  a rerun of failed cases), an earlier week's phases take :data:`EARLIER_WEEK_BASE` and a path capped
  at :data:`EARLIER_WEEK_MAX_PATH`: below every phase of the current week, canary included, and above
  every ad-hoc phase (:func:`week_base`, :func:`is_earlier_week`). The scheduler orders equal weights
  by logical date, so without this an older week's repair would win every tie against this week;
- path: the longer the case still has to go, the earlier the phase runs. A case's later
  phases weigh less than its earlier ones only by path, so cases flow through their phases
  depth-first instead of every first phase running before any second one (Airflow's default
  ``downstream`` rule), GPU and CPU phases overlap, and finished cases appear from the first hour.

Airflow evaluates a strategy in the scheduler when it creates, expands or clears task
instances (not on an automatic retry), and the strategy only sees the serialized task: its
``priority_weight``, ``task_id``, ``dag_id`` and the instance's ``run_id`` and ``map_index``. Whether
a later week has started is the one thing it reads from the metadata database (the weekly DAG's runs
after this one, :func:`avsim.airflow_internals.later_run_ids`, on a connection of its own), once per
run every :data:`WEEK_LOOKUP_SECONDS` per process; so a weight is fixed when its task instance is
created or cleared, and an earlier week's task cleared before the later week's run began keeps the
weekly base until it is cleared again.
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

import enum
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.task.priority_strategy import PriorityWeightStrategy

from avsim.artifacts import is_canary_run, is_triage_run, parent_run
from avsim.manifest.models import DEFAULT_BASE_PRIORITY, RunClass
from avsim.plan.build import MAX_PATH_WEIGHT, WEIGHT_PER_MINUTE, phase_weight

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

__all__ = [
    "ADHOC_BASE",
    "CANARY_BASE",
    "EARLIER_WEEK_BASE",
    "EARLIER_WEEK_MAX_PATH",
    "MAX_PATH_WEIGHT",
    "STRATEGIES",
    "TRIAGE_BASE",
    "WEEKLY_BASE",
    "WEIGHT_PER_MINUTE",
    "AdhocCriticalPathPriority",
    "ControlTask",
    "WeeklyCriticalPathPriority",
    "control_priority",
    "critical_path_priority",
    "is_earlier_week",
    "is_rerun",
    "path_weight",
    "phase_priority",
    "run_base",
    "strategy_for",
    "week_base",
]

log = logging.getLogger(__name__)

#: Base of the weekly run's phases.
WEEKLY_BASE: int = DEFAULT_BASE_PRIORITY[RunClass.WEEKLY]
#: Base of ad-hoc runs' phases: below every weekly phase.
ADHOC_BASE: int = DEFAULT_BASE_PRIORITY[RunClass.ADHOC]
#: Base of a canary shard run's phases: above every weekly phase (the canary gates the week).
CANARY_BASE: int = 2 * WEEKLY_BASE

#: Base of a week's triage reruns (:mod:`avsim.triage`): below every phase of the current and earlier
#: weeks, level with ad-hoc work; an earlier week's base never lifts them.
TRIAGE_BASE: int = ADHOC_BASE
#: Base of an earlier week's phases once a later week has started: above every ad-hoc phase...
EARLIER_WEEK_BASE: int = ADHOC_BASE + MAX_PATH_WEIGHT + 1
#: ...and, with its path part capped here (in minutes: 66 hours of a case still to go), below every
#: phase of the current week.
EARLIER_WEEK_MAX_PATH: int = WEEKLY_BASE - EARLIER_WEEK_BASE - 1
#: ``avsim rerun-failed`` names its runs so (:mod:`avsim.rerun`): a rerun of an earlier run's failed
#: cases is never the current week.
RERUN_RUN_PREFIX = "rerun__"
#: How long a process reuses its answer to "has a later week started?" for one run: the scheduler
#: expands a shard run's thousands of task instances with one look-up.
WEEK_LOOKUP_SECONDS = 10.0

_BASES = {RunClass.WEEKLY: WEEKLY_BASE, RunClass.ADHOC: ADHOC_BASE}

# The rule's invariant: the path part never bridges the gap between two run classes.
if not (CANARY_BASE - WEEKLY_BASE > MAX_PATH_WEIGHT and WEEKLY_BASE - ADHOC_BASE > MAX_PATH_WEIGHT):
    raise RuntimeError(
        f"priority bases {CANARY_BASE}/{WEEKLY_BASE}/{ADHOC_BASE} are closer than MAX_PATH_WEIGHT "
        f"({MAX_PATH_WEIGHT}): a long ad-hoc path would outrank a weekly phase; widen the bases"
    )


if EARLIER_WEEK_MAX_PATH < 24 * 60:
    raise RuntimeError(
        f"an earlier week's phases have {EARLIER_WEEK_MAX_PATH} minutes of path between the ad-hoc and the "
        "weekly bases: widen the gap between them"
    )


def path_weight(remaining_seconds: float) -> int:
    """The path part of a phase's weight: its case's remaining critical path from the phase
    (the phase included), in whole minutes, at least 1 and at most :data:`MAX_PATH_WEIGHT`.

    This is what the DAG builder puts in a phase task's ``priority_weight``."""
    return phase_weight(0, remaining_seconds)


def run_base(run_class: RunClass | str, run_id: str | None = None) -> int:
    """The base weight of a run: :data:`CANARY_BASE` for a canary shard run, :data:`TRIAGE_BASE` for a
    triage shard run, else its class's."""
    if is_canary_run(run_id):
        return CANARY_BASE
    if is_triage_run(run_id):
        return TRIAGE_BASE
    return _BASES[RunClass(run_class)]


def critical_path_priority(base: int, path: int, max_path: int = MAX_PATH_WEIGHT) -> int:
    """The rule: ``base + path``, the path part clamped to ``[0, max_path]`` so that no phase,
    whatever its task's ``priority_weight`` says, crosses into another run class."""
    return base + min(max_path, max(0, int(path)))


def is_rerun(run_id: str) -> bool:
    """Whether a weekly run is an ``avsim rerun-failed`` run (of an earlier run's failed cases)."""
    return str(run_id).startswith(RERUN_RUN_PREFIX)


def is_earlier_week(run_id: str, later_run_ids: Sequence[str] | None) -> bool:
    """Whether weekly run ``run_id`` ranks as an earlier week: a later week has started (a run of the
    weekly DAG after it that is not a rerun), or it is a rerun itself. ``later_run_ids``: the weekly
    DAG's runs after it (None: unknown, so the current week)."""
    return is_rerun(run_id) or any(not is_rerun(r) for r in later_run_ids or ())


def week_base(base: int, earlier_week: bool) -> tuple[int, int]:
    """The base and the path cap of a weekly phase: its run's base (weekly or canary) in the current
    week; :data:`EARLIER_WEEK_BASE` and :data:`EARLIER_WEEK_MAX_PATH` in an earlier one."""
    return (EARLIER_WEEK_BASE, EARLIER_WEEK_MAX_PATH) if earlier_week else (base, MAX_PATH_WEIGHT)


_looked_up: dict[tuple[str, str], tuple[float, bool]] = {}
_lookup_lock = threading.Lock()


def _earlier_week(dag_id: str, run_id: str) -> bool:
    """:func:`is_earlier_week` for a task instance's run, its weekly run read from the metadata
    database (a shard run's is its parent's), reused for :data:`WEEK_LOOKUP_SECONDS`."""
    from avsim.airflow_internals import later_run_ids

    key = parent_run(dag_id, run_id)
    if is_rerun(key[1]):
        return True
    now = time.monotonic()
    with _lookup_lock:
        hit = _looked_up.get(key)
    if hit is not None and now - hit[0] < WEEK_LOOKUP_SECONDS:
        return hit[1]
    try:
        earlier = is_earlier_week(key[1], later_run_ids(*key))
    except Exception as exc:  # no metadata database here (a DAG test): the current week
        log.debug("could not tell whether a later week than %s started: %s", key, exc)
        earlier = False
    with _lookup_lock:
        if len(_looked_up) > 1024:
            _looked_up.clear()
        _looked_up[key] = (now, earlier)
    return earlier


def phase_priority(run_class: RunClass | str, remaining_seconds: float, run_id: str | None = None) -> int:
    """The weight a phase gets, from its case's remaining critical path in seconds (the planner's entry)."""
    return critical_path_priority(run_base(run_class, run_id), path_weight(remaining_seconds))


class _CriticalPathPriority(PriorityWeightStrategy):
    """Base of the run-class strategies; ``run_class`` is set by each subclass."""

    run_class: ClassVar[RunClass]

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        path = task.priority_weight if task is not None else 1
        base = run_base(self.run_class, ti.run_id)
        if self.run_class is RunClass.WEEKLY and not is_triage_run(ti.run_id):
            base, max_path = week_base(base, _earlier_week(ti.dag_id, ti.run_id))
            return critical_path_priority(base, path, max_path)
        return critical_path_priority(base, path)


class WeeklyCriticalPathPriority(_CriticalPathPriority):
    """Weekly run (canary shard runs above it): ``WEEKLY_BASE`` (or ``CANARY_BASE``) + the task's path
    weight; an earlier week's run, once a later week has started: ``EARLIER_WEEK_BASE`` + that path."""

    run_class = RunClass.WEEKLY


class AdhocCriticalPathPriority(_CriticalPathPriority):
    """Ad-hoc runs sharing the weekly pools: ``ADHOC_BASE`` + the task's path weight."""

    run_class = RunClass.ADHOC


#: What the plugin registers (``AirflowPlugin.priority_weight_strategies``).
STRATEGIES: tuple[type[PriorityWeightStrategy], ...] = (WeeklyCriticalPathPriority, AdhocCriticalPathPriority)


class ControlTask(enum.Enum):
    """A weekly or shard DAG task that is not a phase, by what its weight must do (:func:`control_priority`)."""

    #: The parent's ``canary`` and ``canary_gate``: the canary gates the week, so above every phase.
    CANARY = "canary"
    #: A few seconds of work that phases wait for: ``prepare``, a shard run's ``load_shard``,
    #: ``cases_*`` and ``summarize``, the deadline tracker. Above every phase of the week (never
    #: held back by a per-run limit, they cannot crowd the scheduler's query).
    BOOKKEEPING = "bookkeeping"
    #: ``close_week`` and ``report``: after every case, nothing waits behind them.
    WEEK_END = "week_end"
    #: The parent's ``shard_start`` and ``shards``: see :func:`control_priority`.
    SHARD_START = "shard_start"


#: The absolute weights, in multiples of the run class's base.
_CONTROL_FACTORS = {ControlTask.CANARY: 3, ControlTask.BOOKKEEPING: 2, ControlTask.WEEK_END: 1}


def control_priority(task: ControlTask, run_class: RunClass | str) -> dict[str, Any]:
    """The ``priority_weight`` and ``weight_rule`` of a task that is not a phase (operator kwargs).

    A ``shard_start`` or ``shards`` task (:attr:`ControlTask.SHARD_START`) weighs its run's phase base
    with a path of 0,
    under the phases' own strategy: below every phase of its run (each weighs the base plus a path of
    at least 1) and above every phase ranked lower. So the current week's weigh :data:`WEEKLY_BASE`
    (ahead of an earlier week's and ad-hoc phases), and an earlier week's or an ``avsim rerun-failed``
    run's :data:`EARLIER_WEEK_BASE` (below their own phases, which weigh that base plus their path).

    Why below: a ``shard_start`` task held back by its per-run cap stays *scheduled*. Airflow 3.3's
    scheduler takes the heaviest scheduled task instances (at most its free executor slots, 16 here),
    learns only from that list that a task is at its per-run limit, and stops once a pass found
    anything to queue: weighing more than the phases, k waiting tasks would leave a loop 16 - k phases
    to queue (docs/design.md, "Admission by cases in flight").

    The others weigh a multiple of their class's base, absolute (:class:`ControlTask`)."""
    if task is ControlTask.SHARD_START:
        # By the strategy's import path: Airflow 3.3 serializes a mapped task's partial kwargs without
        # encoding a strategy instance, and cannot load it back ("Unknown priority strategy <...>").
        strategy = type(strategy_for(run_class))
        return {"priority_weight": 0, "weight_rule": f"{strategy.__module__}.{strategy.__qualname__}"}
    return {
        "priority_weight": _CONTROL_FACTORS[task] * _BASES[RunClass(run_class)],
        "weight_rule": "absolute",
    }


def strategy_for(run_class: RunClass | str) -> PriorityWeightStrategy:
    """The strategy instance a DAG's phase tasks take as ``weight_rule``."""
    rc = RunClass(run_class)
    return WeeklyCriticalPathPriority() if rc is RunClass.WEEKLY else AdhocCriticalPathPriority()
