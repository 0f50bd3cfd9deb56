"""The finish estimate of a weekly run: what is left to run, on the GPUs in use, against the deadline.

Pure functions over plain data (no Airflow), so the numbers can be checked by hand: the finish is now
plus the larger of the GPU-bound time (GPU-seconds left over the GPUs in use) and the path-bound time
(the longest path left in a case); the GPUs needed are the fewest that bring the GPU-bound time within
the deadline. The model: docs/design.md, "The deadline" (*The estimate*).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from avsim.errors import AvsimError, Problem

#: Task-instance states, as the execution API counts them.
FINISHED_STATES = ("success", "failed", "upstream_failed", "skipped", "removed")
#: States in which a phase holds its pool slot (and its GPU).
ACTIVE_STATES = ("queued", "running", "deferred", "restarting")
#: Ready, waiting for a pool slot.
WAITING_STATES = ("scheduled",)


class PlanDocumentError(AvsimError):
    """``manifest/plan.json`` of a run is missing a field or has a wrong one."""


@dataclass(frozen=True)
class PhaseWork:
    """One phase task of the shard DAG (``<family>.<phase>``) as the run planned it."""

    task_id: str
    cases: int
    gpus: int
    estimated_seconds: float
    upstream: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlannedWork:
    """What the run planned: its deadline and, per phase task, cases, GPUs and duration."""

    deadline: dt.datetime
    phases: tuple[PhaseWork, ...]

    @classmethod
    def from_document(
        cls, doc: Mapping[str, Any], graph: Mapping[str, list[str] | tuple[str, ...]], source: str
    ) -> PlannedWork:
        """Read ``plan.json`` (written by the weekly run's ``prepare``) against the deployed phase graph.

        ``graph`` maps every phase task id of the shard DAG to its upstream task ids; a phase the
        document does not list has no cases this week.
        """
        problems: list[Problem] = []
        deadline = _parse_deadline(doc.get("deadline"), problems)
        per_phase = doc.get("per_phase")
        if not isinstance(per_phase, Mapping):
            problems.append(Problem("per_phase", "missing or not a mapping of '<family>.<phase>' -> work"))
            per_phase = {}
        unknown = sorted(set(per_phase) - set(graph))
        for task_id in unknown:
            problems.append(
                Problem(
                    f"per_phase[{task_id!r}]",
                    f"not a phase of the deployed shard DAG (known: {', '.join(sorted(graph))})",
                )
            )
        phases = []
        for task_id in sorted(graph):
            entry = per_phase.get(task_id, {"cases": 0, "gpus": 0, "estimated_seconds": 0})
            where = f"per_phase[{task_id!r}]"
            if not isinstance(entry, Mapping):
                problems.append(Problem(where, "must be a mapping with cases, gpus, estimated_seconds"))
                continue
            cases = _number(entry, "cases", where, problems, integer=True)
            gpus = _number(entry, "gpus", where, problems, integer=True)
            seconds = _number(entry, "estimated_seconds", where, problems, integer=False)
            phases.append(PhaseWork(task_id, int(cases), int(gpus), float(seconds), tuple(graph[task_id])))
        if problems:
            lines = "\n".join(f"  {p}" for p in problems)
            raise PlanDocumentError(
                f"{source} cannot be used to track the deadline:\n{lines}\n"
                "It is written by the weekly run's prepare task; rerun prepare (clear it) to rewrite it."
            )
        assert deadline is not None
        return cls(deadline, tuple(phases))


def _parse_deadline(value: object, problems: list[Problem]) -> dt.datetime | None:
    if not isinstance(value, str):
        problems.append(Problem("deadline", f"must be an ISO 8601 date-time with a time zone, got {value!r}"))
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        problems.append(Problem("deadline", f"is not an ISO 8601 date-time: {value!r}"))
        return None
    if parsed.tzinfo is None:
        problems.append(Problem("deadline", f"has no time zone: {value!r}; add one, e.g. 'Z'"))
        return None
    return parsed


def _number(
    entry: Mapping[str, Any], key: str, where: str, problems: list[Problem], *, integer: bool
) -> float:
    value = entry.get(key)
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < 0 or not math.isfinite(value):  # type: ignore[operator, arg-type]
        kind = "a whole number" if integer else "a number"
        problems.append(Problem(f"{where}.{key}", f"must be {kind} >= 0, got {value!r}"))
        return 0.0
    return float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PhaseProgress:
    """Task-instance counts of one phase task over the week's shard runs."""

    finished: int = 0
    active: int = 0
    waiting: int = 0


@dataclass(frozen=True)
class Estimate:
    """One re-estimate of the run's finish (the document ``deadline/latest.json`` holds)."""

    at: dt.datetime
    deadline: dt.datetime
    estimated_finish: dt.datetime | None
    seconds_late: float | None
    gpus_in_use: int
    gpus_needed: int | None
    gpu_bound: bool
    remaining_gpu_seconds: float
    remaining_cpu_seconds: float
    remaining_path_seconds: float
    cases_left: int
    reason: str
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def late(self) -> bool:
        return self.seconds_late is not None and self.seconds_late > 0

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for key in ("at", "deadline", "estimated_finish"):
            value = doc[key]
            doc[key] = value.isoformat() if value is not None else None
        doc["late"] = self.late
        return doc


def remaining_paths(phases: tuple[PhaseWork, ...]) -> dict[str, float]:
    """Per phase task: its estimated seconds plus the longest path after it to the end of its case."""
    downstream: dict[str, list[str]] = {p.task_id: [] for p in phases}
    for p in phases:
        for up in p.upstream:
            if up in downstream:
                downstream[up].append(p.task_id)
    by_id = {p.task_id: p for p in phases}
    memo: dict[str, float] = {}

    def path(task_id: str, seen: frozenset[str]) -> float:
        if task_id in memo:
            return memo[task_id]
        if task_id in seen:
            raise AvsimError(f"the phase graph has a cycle through {task_id}")
        after = [path(d, seen | {task_id}) for d in downstream[task_id]]
        memo[task_id] = by_id[task_id].estimated_seconds + max(after, default=0.0)
        return memo[task_id]

    return {p.task_id: path(p.task_id, frozenset()) for p in phases}


@dataclass
class _Left:
    """What is left of the run's planned work, summed over its phases."""

    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    path_seconds: float = 0.0
    gpus_in_use: int = 0
    gpu_waiting: int = 0
    cases: int = 0
    phases: dict[str, dict[str, int]] = field(default_factory=dict)


def _left(planned: PlannedWork, progress: Mapping[str, PhaseProgress]) -> _Left:
    paths = remaining_paths(planned.phases)
    out = _Left()
    left_by_family: dict[str, int] = {}
    for p in planned.phases:
        prog = progress.get(p.task_id, PhaseProgress())
        left = max(0, p.cases - prog.finished)
        active = min(prog.active, left)
        not_started = left - active
        units = not_started + 0.5 * active
        if p.gpus:
            out.gpu_seconds += units * p.gpus * p.estimated_seconds
            out.gpus_in_use += active * p.gpus
            out.gpu_waiting += prog.waiting
        else:
            out.cpu_seconds += units * p.estimated_seconds
        if left:
            half = 0.5 * p.estimated_seconds if not_started == 0 else 0.0
            out.path_seconds = max(out.path_seconds, paths[p.task_id] - half)
        family = p.task_id.split(".", 1)[0]
        left_by_family[family] = max(left_by_family.get(family, 0), left)  # a case is left while any phase is
        out.phases[p.task_id] = {
            "planned": p.cases,
            "finished": prog.finished,
            "active": prog.active,
            "waiting": prog.waiting,
        }
    out.cases = sum(left_by_family.values())
    return out


def _reason(seconds_late: float, path_left: float, capacity: int, gpus_needed: int | None) -> str:
    if seconds_late <= 0:
        return f"on track: {-seconds_late / 3600:.1f} h ahead of the deadline"
    if gpus_needed is None:
        return (
            f"late by {seconds_late / 3600:.1f} h and the longest path left ({path_left / 3600:.1f} h) "
            "alone passes the deadline: more GPUs cannot make it"
        )
    # late, and the GPU-bound time is what passes the deadline
    return f"late by {seconds_late / 3600:.1f} h on {capacity} GPUs; {gpus_needed} GPUs would make it"


def estimate_finish(
    planned: PlannedWork,
    progress: Mapping[str, PhaseProgress],
    now: dt.datetime,
    *,
    gpu_capacity: int = 0,
) -> Estimate:
    """Re-estimate the run's finish from what is left and the GPUs in use.

    ``gpu_capacity``: GPUs known to be available (e.g. the pools' slots); the estimate uses the
    larger of it and the GPUs in use, so it can be given before the first GPU phase starts.
    """
    left = _left(planned, progress)
    capacity = max(left.gpus_in_use, gpu_capacity)
    common = {
        "at": now,
        "deadline": planned.deadline,
        "gpus_in_use": left.gpus_in_use,
        "gpu_bound": left.gpu_waiting > 0,
        "remaining_gpu_seconds": round(left.gpu_seconds, 3),
        "remaining_cpu_seconds": round(left.cpu_seconds, 3),
        "remaining_path_seconds": round(left.path_seconds, 3),
        "cases_left": left.cases,
        "phases": left.phases,
    }
    if left.gpu_seconds > 0 and capacity == 0:
        return Estimate(
            estimated_finish=None,
            seconds_late=None,
            gpus_needed=None,
            reason="no GPU phase is running yet, so there is no GPU capacity to estimate from",
            **common,  # type: ignore[arg-type]
        )
    gpu_time = left.gpu_seconds / capacity if left.gpu_seconds else 0.0
    finish = now + dt.timedelta(seconds=max(gpu_time, left.path_seconds))
    seconds_late = (finish - planned.deadline).total_seconds()
    time_left = (planned.deadline - now).total_seconds()
    gpus_needed: int | None = None
    if time_left > left.path_seconds:
        gpus_needed = math.ceil(left.gpu_seconds / time_left) if left.gpu_seconds else 0
    return Estimate(
        estimated_finish=finish,
        seconds_late=round(seconds_late, 3),
        gpus_needed=gpus_needed,
        reason=_reason(seconds_late, left.path_seconds, capacity, gpus_needed),
        **common,  # type: ignore[arg-type]
    )
