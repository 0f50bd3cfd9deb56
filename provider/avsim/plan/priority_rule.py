"""The critical-path priority rule: a phase's weight from its run class, its week and its path.

``weight = base(run class, run id, week) + path(remaining minutes)``, the path part capped below every
gap between two bases. Pure: the DAG builder and the planner call it with the plan's durations, the
Airflow strategies (:mod:`avsim.priority`) with what the scheduler sees; docs/design.md says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from avsim.artifacts import is_canary_run, is_triage_run
from avsim.manifest.models import RunClass

#: Path weight per minute of a case's remaining critical path, capped at :data:`MAX_PATH_WEIGHT`.
WEIGHT_PER_MINUTE = 1
MAX_PATH_WEIGHT = 5_000

#: The base of a run class's phases: every weekly phase outranks every ad-hoc one.
RUN_CLASS_BASE: dict[RunClass, int] = {RunClass.WEEKLY: 10_000, RunClass.ADHOC: 1_000}
WEEKLY_BASE: int = RUN_CLASS_BASE[RunClass.WEEKLY]
ADHOC_BASE: int = RUN_CLASS_BASE[RunClass.ADHOC]
#: A canary shard run's base: above every weekly phase (the canary gates the week).
CANARY_BASE: int = 2 * WEEKLY_BASE
#: A triage shard run's base (:mod:`avsim.triage`): level with ad-hoc work, below every phase of this
#: and earlier weeks; an earlier week's base never lifts it.
TRIAGE_BASE: int = ADHOC_BASE
#: An earlier week's base once a later week has started: above every ad-hoc phase...
EARLIER_WEEK_BASE: int = ADHOC_BASE + MAX_PATH_WEIGHT + 1
#: ...and, its path capped here (in minutes: 66 hours of a case still to go), below every phase of the
#: current week.
EARLIER_WEEK_MAX_PATH: int = WEEKLY_BASE - EARLIER_WEEK_BASE - 1
#: ``avsim rerun-failed`` names its runs so (:mod:`avsim.rerun`): such a run is never the current week.
RERUN_RUN_PREFIX = "rerun__"

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
    """The path part of a phase's weight: its case's remaining critical path from the phase (the phase
    included), in whole minutes, at least 1 and at most :data:`MAX_PATH_WEIGHT`. A phase task carries
    it as its ``priority_weight``."""
    return min(MAX_PATH_WEIGHT, WEIGHT_PER_MINUTE * max(1, math.ceil(remaining_seconds / 60.0)))


def run_base(run_class: RunClass, run_id: str | None = None) -> int:
    """The base of a run in the current week: :data:`CANARY_BASE` for a canary shard run,
    :data:`TRIAGE_BASE` for a triage shard run, else its class's."""
    if is_canary_run(run_id):
        return CANARY_BASE
    if is_triage_run(run_id):
        return TRIAGE_BASE
    return RUN_CLASS_BASE[RunClass(run_class)]


def critical_path_priority(base: int, path: int, max_path: int = MAX_PATH_WEIGHT) -> int:
    """``base + path``, the path part clamped to ``[0, max_path]`` so that no phase, whatever its task's
    ``priority_weight`` says, crosses into another run class."""
    return base + min(max_path, max(0, int(path)))


def is_rerun(run_id: str) -> bool:
    """Whether a weekly run is an ``avsim rerun-failed`` run (of an earlier run's failed cases)."""
    return str(run_id).startswith(RERUN_RUN_PREFIX)


def is_earlier_week(run_id: str, later_run_ids: Sequence[str] | None) -> bool:
    """Whether weekly run ``run_id`` ranks as an earlier week: a later week has started (a run of the
    weekly DAG after it that is not a rerun), or it is a rerun itself. ``later_run_ids``: the weekly
    DAG's runs after it (None: unknown, so the current week)."""
    return is_rerun(run_id) or any(not is_rerun(r) for r in later_run_ids or ())


def ranks_by_week(run_class: RunClass, run_id: str | None) -> bool:
    """Whether the week decides a run's base: a weekly run's phases (its canary's too) do; ad-hoc and
    triage runs keep their base whatever the week."""
    return RunClass(run_class) is RunClass.WEEKLY and not is_triage_run(run_id)


def priority(run_class: RunClass, path: int, run_id: str | None = None, earlier_week: bool = False) -> int:
    """The rule: the weight of a phase of ``run_class`` with path part ``path`` in run ``run_id`` (a
    canary, a triage or a shard run), of an earlier week (:func:`is_earlier_week`) or of the current one.

    An earlier week's weekly phases (its canary's too) take :data:`EARLIER_WEEK_BASE` and a path capped
    at :data:`EARLIER_WEEK_MAX_PATH`: below every phase of the current week, above every ad-hoc one."""
    if earlier_week and ranks_by_week(run_class, run_id):
        return critical_path_priority(EARLIER_WEEK_BASE, path, EARLIER_WEEK_MAX_PATH)
    return critical_path_priority(run_base(run_class, run_id), path)


def phase_priority(run_class: RunClass, remaining_seconds: float, run_id: str | None = None) -> int:
    """The weight of a phase of the current week from its case's remaining critical path in seconds
    (the plan's and the planner's entry)."""
    return priority(run_class, path_weight(remaining_seconds), run_id)
