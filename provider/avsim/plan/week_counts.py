"""A week's cases in flight, counted from Airflow for admission (:mod:`avsim.plan.admission`).

:class:`ExecutionApiCounts` reads task-instance states and counts through the execution API (the
deadline tracker counts through it too); a test gives its own :class:`WeekCounts`. One count is
three state reads, the last of the last phases of the shard runs in progress, so it grows with the
cases in flight, not with the week (docs/design.md, "Admission by cases in flight (the default)").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from avsim.artifacts import canary_run_id, shard_run_id, week_run_ids
from avsim.contracts import RunDescriptor
from avsim.plan.admission import (
    Admission,
    InFlight,
    admit,
    admit_by_window,
    shard_case_count,
)

#: Task-instance states in which a task instance has ended (or was ruled out) and will not run again
#: unless cleared.
ENDED_TI_STATES = ("success", "failed", "upstream_failed", "skipped", "removed")

#: Task-instance states in which a task instance holds its pool slot: a case whose last phases are CPU
#: phases in one of them counts as ending (:attr:`WeekShape.cpu_ends`). ``scheduled`` holds no slot.
IN_SLOT_TI_STATES = ("queued", "running", "deferred")

#: The shard DAG's first task: its task instance is created with the shard run.
SHARD_FIRST_TASK = "load_shard"
#: The shard DAG's last task (trigger rule all_done): when it has ended, every case of the run has.
SHARD_LAST_TASK = "summarize"


class WeekCounts(Protocol):
    """Where admission's task-instance states and counts come from."""

    def ti_count(
        self,
        *,
        dag_id: str,
        run_ids: list[str],
        task_ids: list[str],
        states: list[str] | None,
        map_index: int | None = None,
    ) -> int: ...

    def task_states(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str]
    ) -> dict[str, dict[str, Any]]: ...


#: Run ids per execution-API call: each travels in the request's query string (about 70 bytes
#: encoded), and a week of 200 shard runs in one would pass 14 KB, near servers' request-line limits.
RUN_IDS_PER_CALL = 40


def _chunks(run_ids: list[str]) -> list[list[str]]:
    """``run_ids`` in calls of at most :data:`RUN_IDS_PER_CALL`; never an empty list (the API reads an
    empty filter as none)."""
    return [run_ids[i : i + RUN_IDS_PER_CALL] for i in range(0, len(run_ids), RUN_IDS_PER_CALL)]


class ExecutionApiCounts:
    """Counts and states from Airflow's execution API, through this process's supervisor."""

    def ti_count(
        self,
        *,
        dag_id: str,
        run_ids: list[str],
        task_ids: list[str],
        states: list[str] | None,
        map_index: int | None = None,
    ) -> int:
        from avsim.airflow_internals import runtime_task_instance

        ti = runtime_task_instance()
        return sum(
            int(
                ti.get_ti_count(
                    dag_id=dag_id, run_ids=part, task_ids=task_ids, states=states, map_index=map_index
                )
            )
            for part in _chunks(run_ids)
        )

    def dr_count(self, *, dag_id: str, run_ids: list[str], states: list[str]) -> int:
        from avsim.airflow_internals import runtime_task_instance

        ti = runtime_task_instance()
        return sum(
            int(ti.get_dr_count(dag_id=dag_id, run_ids=part, states=states)) for part in _chunks(run_ids)
        )

    def task_states(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        from avsim.airflow_internals import runtime_task_instance

        ti = runtime_task_instance()
        out: dict[str, dict[str, Any]] = {}
        for part in _chunks(run_ids):
            found = ti.get_task_states(dag_id=dag_id, run_ids=part, task_ids=task_ids)
            out.update({str(k): dict(v) for k, v in (found or {}).items()})
        return out


@dataclass(frozen=True)
class WeekShape:
    """What admission needs to know of a week: its runs, its shards and where its cases end.

    JSON-able (:meth:`to_json`): it travels in the admission trigger's arguments."""

    dag_id: str
    run_id: str
    shard_dag_id: str
    #: The mapped task that starts the shard runs (map index k - 1 is shard k).
    shards_task_id: str
    shard_count: int
    shard_size: int
    #: Cases in shards 1..n (the canary's not included).
    cases: int
    canary_cases: int = 0
    #: Per graph family: the task ids whose ended task instances count the family's finished cases
    #: (one per last phase; with several, a case has ended when all have, so the smallest count holds).
    case_ends: tuple[tuple[str, ...], ...] = field(default_factory=tuple)
    #: Of those, the CPU phases' tasks: a case counts as ending once each of them is in its slot
    #: (:func:`cpu_end_tasks`), so a refill lands as the case ends, not one count later.
    cpu_ends: tuple[str, ...] = field(default_factory=tuple)
    #: ``[avsim] admission = window``: at most this many shard runs in progress (W); 0 admits by cases.
    window: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "case_ends": [list(t) for t in self.case_ends],
            "cpu_ends": list(self.cpu_ends),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WeekShape:
        return cls(
            **{
                **doc,
                "case_ends": tuple(tuple(t) for t in doc.get("case_ends") or ()),
                "cpu_ends": tuple(doc.get("cpu_ends") or ()),
            }
        )

    @classmethod
    def of_run(
        cls,
        run: RunDescriptor,
        *,
        dag_id: str,
        run_id: str,
        shard_dag_id: str,
        shards_task_id: str,
        case_ends: Sequence[Sequence[str]],
        cpu_ends: Sequence[str] = (),
        window: int = 0,
    ) -> WeekShape | None:
        """The week of run descriptor ``run``: admitted by cases in flight, or by a ``window`` of W shard
        runs when it has no admission plan (``[avsim] admission = window``); None when neither applies."""
        if run.admission is None and window < 1:
            return None
        if run.admission is not None and (not run.shard_size or not case_ends):
            return None
        return cls(
            dag_id=dag_id,
            run_id=run_id,
            shard_dag_id=shard_dag_id,
            shards_task_id=shards_task_id,
            shard_count=run.shard_count,
            shard_size=run.shard_size,
            cases=run.case_count - run.canary_count,
            canary_cases=run.canary_count,
            case_ends=tuple(tuple(t) for t in case_ends),
            cpu_ends=tuple(cpu_ends),
            window=0 if run.admission is not None else window,
        )

    def run_id_of(self, shard: int) -> str:
        return shard_run_id(self.run_id, shard)

    def size_of(self, shard: int) -> int:
        return shard_case_count(shard, self.cases, self.shard_size)

    @property
    def run_ids(self) -> list[str]:
        return week_run_ids(self.run_id, self.shard_count, canary=bool(self.canary_cases))


def _last_phases(family: Any) -> list[Any]:
    """The phases of a family (:class:`avsim.plan.model.FamilyPlan`) that no other phase of it waits for."""
    waited_for = {u for phase in family.phases for u in phase.upstream}
    return [phase for phase in family.phases if phase.name not in waited_for]


def case_end_tasks(families: Sequence[Any]) -> tuple[tuple[str, ...], ...]:
    """:attr:`WeekShape.case_ends` of a plan's families (:class:`avsim.plan.model.FamilyPlan`): each
    family's phases that no other phase of it waits for, as ``<group>.<task>``. A phase with an on-demand
    twin ends when both tasks have: a twin skipped because its spot task failed stays skipped through a
    repair that reruns the spot task, so the twin alone would count a case in repair as finished."""
    out = []
    for family in families:
        ends = []
        for phase in _last_phases(family):
            ends.append(f"{family.group_id}.{phase.name}")
            if getattr(phase, "on_demand_fallback", False):
                ends.append(f"{family.group_id}.{phase.on_demand_task}")
        out.append(tuple(ends))
    return tuple(out)


def cpu_end_tasks(families: Sequence[Any]) -> tuple[str, ...]:
    """Of :func:`case_end_tasks`, the CPU phases' (no GPU): short and in their own pool, so a case whose
    only work left is them in their slots ends within a phase, while a GPU last phase may run for long."""
    return tuple(
        f"{family.group_id}.{phase.name}"
        for family in families
        for phase in _last_phases(family)
        if not phase.gpus
    )


def read_in_flight(counts: WeekCounts, week: WeekShape, shard: int) -> InFlight:
    """The week's cases in flight as shard ``shard`` sees them (:class:`avsim.plan.admission.InFlight`).

    A shard run is in progress from its creation until its ``summarize`` ends (it runs whatever its
    cases did, last): an ended one holds no case, a repaired one (``summarize`` cleared) holds its
    cases again until they end anew."""
    run_ids = week.run_ids
    runs = counts.task_states(
        dag_id=week.shard_dag_id, run_ids=run_ids, task_ids=[SHARD_FIRST_TASK, SHARD_LAST_TASK]
    )
    active = [r for r in run_ids if r in runs and runs[r].get(SHARD_LAST_TASK) not in ENDED_TI_STATES]
    sizes = {week.run_id_of(k): week.size_of(k) for k in range(1, week.shard_count + 1)}
    sizes[canary_run_id(week.run_id)] = week.canary_cases
    waiting: list[int] = []
    earlier = [k for k in range(1, shard) if week.run_id_of(k) not in runs]
    if earlier:
        states = counts.task_states(
            dag_id=week.dag_id, run_ids=[week.run_id], task_ids=[week.shards_task_id]
        ).get(week.run_id, {})
        waiting = [k for k in earlier if states.get(f"{week.shards_task_id}_{k - 1}") not in ENDED_TI_STATES]
    finished = 0
    if not week.window:  # the window counts shard runs, not cases
        finished = _finished_cases(counts, week.shard_dag_id, active, week.case_ends, week.cpu_ends)
    return InFlight(
        admitted_cases=sum(sizes.get(r, 0) for r in active),
        finished_cases=finished,
        earlier_waiting=waiting[0] if waiting else None,
        earlier_waiting_cases=sum(week.size_of(k) for k in waiting),
        active_runs=len(active),
    )


def decide(week: WeekShape, shard: int, found: InFlight, target: int) -> Admission:
    """Shard ``shard``'s admission over ``found``: by W shard runs when the week has a window, else by
    ``target`` cases in flight (:mod:`avsim.plan.admission`)."""
    if week.window:
        return admit_by_window(shard, found, week.window)
    return admit(shard, week.size_of(shard), found, target)


def _finished_cases(
    counts: WeekCounts,
    dag_id: str,
    run_ids: list[str],
    case_ends: Sequence[Sequence[str]],
    cpu_ends: Sequence[str] = (),
) -> int:
    """Cases of ``run_ids`` whose every last phase has ended, or for a CPU phase (``cpu_ends``) is in its
    slot, every graph family in one state read. Counting a case as ending there starts the next shard run
    while its last phase runs: a refill takes a count and a REST call (seconds), and equal cases end
    together. The cases counted early are at most the CPU pool's slots.

    A mapped task instance's key carries its map index (``<task>_<i>``). A family without cases in a
    run leaves its group unexpanded: one task instance with map index -1 (skipped, or upstream_failed
    when the run's case list failed), keyed without an index, which is no case. No count can leave it
    out: the task SDK's client drops a map index below 0 from a count's filter."""
    family_of = {task: i for i, ends in enumerate(case_ends) for task in ends}
    in_slot_ends = set(cpu_ends)
    if not run_ids or not family_of:
        return 0
    states = counts.task_states(dag_id=dag_id, run_ids=run_ids, task_ids=list(family_of))
    n = 0
    for by_task in states.values():
        ended: dict[tuple[int, str], int] = {}
        for key, state in by_task.items():
            task, _, index = key.rpartition("_")
            ending = state in ENDED_TI_STATES or (task in in_slot_ends and state in IN_SLOT_TI_STATES)
            if task in family_of and index.isdigit() and ending:
                case = (family_of[task], index)
                ended[case] = ended.get(case, 0) + 1
        n += sum(1 for (family, _), count in ended.items() if count == len(case_ends[family]))
    return n


def decide_now(
    counts: WeekCounts,
    week: WeekShape,
    shard: int,
    target: int,
    *,
    patience_seconds: float = 0.0,
    poll_seconds: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Admission:
    """Whether shard ``shard`` starts now (:func:`avsim.plan.admission.admit` over a fresh count). While
    it must wait (its turn or room), it counts again every ``poll_seconds`` for up to
    ``patience_seconds``: a deferral resumes no sooner than its resume bound (:mod:`avsim.resume`) and
    a worker's start, so a turn or room that comes within that time is taken sooner from here."""
    decision = decide(week, shard, read_in_flight(counts, week, shard), target)
    waited = 0.0
    while not decision.admitted and waited + poll_seconds <= patience_seconds:
        sleep(poll_seconds)
        waited += poll_seconds
        decision = decide(week, shard, read_in_flight(counts, week, shard), target)
    return decision
