"""The Airflow priority weight strategies that apply the rule of :mod:`avsim.plan.priority_rule`.

A phase task carries its path part as ``priority_weight`` and a strategy of its run class as
``weight_rule``; the strategy adds the base its run and week take. Whether a later week has started is
read from the metadata database, once per run every :data:`WEEK_LOOKUP_SECONDS` per process. The
strategies are registered through the plugin (:data:`STRATEGIES`); docs/design.md says why.
Control tasks (not phases) take :func:`control_priority`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.task.priority_strategy import PriorityWeightStrategy

from avsim.artifacts import parent_run
from avsim.manifest.models import RunClass
from avsim.plan.priority_rule import (
    ADHOC_BASE,
    CANARY_BASE,
    EARLIER_WEEK_BASE,
    EARLIER_WEEK_MAX_PATH,
    MAX_PATH_WEIGHT,
    RUN_CLASS_BASE,
    TRIAGE_BASE,
    WEEKLY_BASE,
    critical_path_priority,
    is_earlier_week,
    is_rerun,
    path_weight,
    phase_priority,
    priority,
    ranks_by_week,
    run_base,
)

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
]

log = logging.getLogger(__name__)

#: How long a process reuses its answer to "has a later week started?" for one run: the scheduler
#: expands a shard run's thousands of task instances with one look-up.
WEEK_LOOKUP_SECONDS = 10.0

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


class _CriticalPathPriority(PriorityWeightStrategy):
    """Base of the run-class strategies; ``run_class`` is set by each subclass (a strategy is stateless:
    Airflow stores only its class's import path)."""

    run_class: ClassVar[RunClass]

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        path = task.priority_weight if task is not None else 1
        earlier = ranks_by_week(self.run_class, ti.run_id) and _earlier_week(ti.dag_id, ti.run_id)
        return priority(self.run_class, path, ti.run_id, earlier)


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


def control_priority(task: ControlTask, run_class: RunClass) -> dict[str, Any]:
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
        "priority_weight": _CONTROL_FACTORS[task] * RUN_CLASS_BASE[RunClass(run_class)],
        "weight_rule": "absolute",
    }


def strategy_for(run_class: RunClass) -> PriorityWeightStrategy:
    """The strategy instance a DAG's phase tasks take as ``weight_rule``."""
    rc = RunClass(run_class)
    return WeeklyCriticalPathPriority() if rc is RunClass.WEEKLY else AdhocCriticalPathPriority()
