"""Admission at run time: whether the next shard run of a week may start now.

``shard_start`` of shard k starts its shard run as soon as fewer cases than the target are unfinished
(:func:`admit`), in shard order, so a freed place goes to the earliest shard; with the window, while
fewer than W shard runs are in progress. Pure functions of counts (:mod:`avsim.plan.week_counts`
reads them from Airflow; docs/design.md, "Admission by cases in flight (the default)").
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

from avsim.contracts import AdmissionPlan
from avsim.errors import AvsimError
from avsim.plan.inflight import AdmissionError, CaseLoad, Pools, target_cases_in_flight

#: A shard run holds at most this share of the target. ``bench/planner.py`` (10,000 sample cases, 280
#: GPUs, target 702, W = 6): 0.36 (S = 250) ends within 1.009 x the lower bound, 0.33 (234) 1.013, 0.25
#: (175) 1.012 to 1.018 with W = 8 to 12, 0.48 1.040 and 0.57 1.414: below about 0.4 the makespan only
#: moves with how the shard runs' tails interleave; above half a shard run waits for so many free places
#: that few are active and the GPUs idle while the week drains between them.
SHARD_SHARE = 0.36

#: Most shard runs a week is cut into under admission, so the grid's ``shards`` map indexes stay a
#: readable list: a week much larger than its target gets shard runs above :data:`SHARD_SHARE`.
MAX_SHARD_RUNS = 200


def admission_shard_size(cases: int, target: int, largest: int) -> int:
    """The shard size S a week of ``cases`` cases is cut into when admitting by ``target`` cases in
    flight: :data:`SHARD_SHARE` of the target (about a third), at most ``largest`` (``[avsim] shard_size``), and at
    least what keeps the week within :data:`MAX_SHARD_RUNS` shard runs."""
    if cases < 0 or target < 1 or largest < 1:
        raise AvsimError(f"shard size for {cases} cases, target {target}, largest {largest}: bad figures")
    fewest = math.ceil(cases / MAX_SHARD_RUNS) if cases else 1
    return max(1, min(largest, max(int(target * SHARD_SHARE), fewest)))


def shard_case_count(shard: int, cases: int, shard_size: int) -> int:
    """Cases of shard ``shard`` (numbered from 1) when ``cases`` cases are cut into consecutive shards
    of ``shard_size`` (:func:`avsim.plan.shards.cut_shards`); 0 past the last."""
    if shard < 1 or shard_size < 1:
        return 0
    return max(0, min(shard_size, cases - (shard - 1) * shard_size))


@dataclass(frozen=True)
class InFlight:
    """A week's cases as admission counts them, seen from one shard."""

    #: Cases of the week's shard runs that exist (the canary's included).
    admitted_cases: int
    #: Of them, cases whose every last phase has ended (passed, failed, or ruled out), or is a CPU
    #: phase in its slot (:func:`avsim.plan.week_counts.cpu_end_tasks`): ending within that phase.
    finished_cases: int
    #: The earliest shard before this one with neither a shard run nor an ended ``shard_start`` task
    #: (it starts first); None when there is none.
    earlier_waiting: int | None = None
    #: The cases of every such earlier shard: admission counts them as started, so later shards take
    #: only the room the earlier ones leave, and all that fit start together.
    earlier_waiting_cases: int = 0
    #: The week's shard runs in progress (the canary's included).
    active_runs: int = 0

    @property
    def unfinished_cases(self) -> int:
        return max(0, self.admitted_cases - self.finished_cases)


class AdmissionVerdict(enum.Enum):
    ADMIT = "admit"
    #: An earlier shard starts first.
    WAIT_TURN = "wait_turn"
    #: Too many cases in flight.
    WAIT_ROOM = "wait_room"


@dataclass(frozen=True)
class Admission:
    verdict: AdmissionVerdict
    reason: str

    @property
    def admitted(self) -> bool:
        return self.verdict is AdmissionVerdict.ADMIT


def admit(shard: int, size: int, in_flight: InFlight, target: int) -> Admission:
    """Whether shard ``shard`` (``size`` cases) may start its run now, ``target`` cases in flight.

    It starts as soon as fewer than ``target`` cases are unfinished, counting the cases of the earlier
    shards still to start as started: a later shard never takes the room an earlier one needs, and
    when many cases end at once every shard that fits starts in the same count, not one after the
    other. The target is what the week never drops below while cases wait to start, so a shard run
    refills it the moment a case ends and the week peaks at ``target + size - 1``: waiting until a
    whole shard run fits would let the week sink to ``target - size`` before every start, and the GPUs
    idle behind the week's stragglers."""
    unfinished = in_flight.unfinished_cases
    ahead = in_flight.earlier_waiting_cases
    if unfinished + ahead < target:
        after = f" after the {ahead} of the shards before it" if ahead else ""
        return Admission(
            AdmissionVerdict.ADMIT,
            f"{unfinished} cases in flight{after} < target {target}: shard {shard} ({size} cases) starts",
        )
    if in_flight.earlier_waiting is not None and unfinished < target:
        return Admission(
            AdmissionVerdict.WAIT_TURN,
            f"shard {in_flight.earlier_waiting} has not started yet and goes first ({unfinished} cases in "
            f"flight and {ahead} to start before this shard, target {target})",
        )
    return Admission(
        AdmissionVerdict.WAIT_ROOM,
        f"{unfinished} cases in flight >= target {target}: waiting for {unfinished - target + 1} to finish",
    )


def admit_by_window(shard: int, in_flight: InFlight, window: int) -> Admission:
    """``[avsim] admission = window``: shard ``shard`` starts when fewer than ``window`` (W) shard runs
    are in progress and no earlier shard is still to start."""
    if in_flight.earlier_waiting is not None:
        return Admission(
            AdmissionVerdict.WAIT_TURN,
            f"shard {in_flight.earlier_waiting} has not started yet and goes first",
        )
    if in_flight.active_runs < window:
        return Admission(
            AdmissionVerdict.ADMIT, f"{in_flight.active_runs} shard runs in progress < W = {window}"
        )
    return Admission(
        AdmissionVerdict.WAIT_ROOM,
        f"{in_flight.active_runs} shard runs in progress, W = {window}: waiting for one to end",
    )


def admission_plan(
    load: CaseLoad,
    *,
    spot_gpus: int | None,
    cpus: int | None,
    configured: int,
    fallback: int,
    floor: int = 0,
) -> AdmissionPlan:
    """A week's :class:`~avsim.contracts.AdmissionPlan`: its target from ``configured`` (``[avsim]
    cases_in_flight``) when above 0, else from the pools' slots and at least ``floor``
    (:func:`avsim.plan.inflight.comfortable_cases`); ``fallback`` (or the floor) when the slots are not
    known or cannot run the cases (a pool without slots: the phases then wait for it whatever is
    admitted, and ``avsim plan`` names the pool)."""
    doc = {k: float(v) for k, v in dataclasses.asdict(load).items()}
    floor = min(floor, load.cases)
    plan = AdmissionPlan(
        configured=configured,
        target=max(1, fallback, floor),
        spot_gpus=spot_gpus,
        cpus=cpus,
        load=doc,
        floor=floor,
    )
    return plan.model_copy(update={"target": week_target(plan, spot_gpus, cpus)})


def week_target(plan: AdmissionPlan, spot_gpus: int | None, cpus: int | None) -> int:
    """The cases a week keeps in flight now: the configured target, else the one the pools' slots
    (``spot_gpus``, ``cpus``: read now; the deadline tracker may have raised them) give the week's
    mean case; the prepared target when the slots are unknown."""
    if plan.configured:
        return plan.configured
    if spot_gpus is None or cpus is None or not plan.load:
        return plan.target
    doc = plan.load
    try:
        load = CaseLoad(
            cases=int(doc["cases"]),
            gpu_seconds=doc["gpu_seconds"],
            cpu_seconds=doc["cpu_seconds"],
            path_seconds=doc["path_seconds"],
            phases=doc["phases"],
            task_instances=doc["task_instances"],
            twin_task_instances=doc["twin_task_instances"],
            slot_seconds=doc.get("slot_seconds", 0.0),
        )
        return target_cases_in_flight(load, Pools(spot_gpus=spot_gpus, cpus=cpus), floor=plan.floor)
    except (AdmissionError, KeyError):
        return plan.target
