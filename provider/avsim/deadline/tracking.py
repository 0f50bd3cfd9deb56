"""One pass of the deadline tracker: count what finished, re-estimate, record, emit metrics.

Shared by the trigger (in the triggerer) and the sensor's poke mode (in a worker). Neither has
database access in Airflow 3: task-instance and DAG-run counts come from the execution API, the
way the standard provider's ``WorkflowTrigger`` and ``DagStateTrigger`` count them
(``RuntimeTaskInstance.get_ti_count`` / ``get_dr_count``, answered by the process's supervisor).
:class:`ExecutionApiCounts` (:mod:`avsim.plan.week_counts`, admission's too) is that source; a test
gives its own :class:`TaskCounts`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from avsim.artifacts import RunLayout, week_run_ids
from avsim.deadline.estimate import (
    ACTIVE_STATES,
    FINISHED_STATES,
    WAITING_STATES,
    Estimate,
    PhaseProgress,
    PlannedWork,
    estimate_finish,
)
from avsim.errors import AvsimError

log = logging.getLogger(__name__)

#: DAG-run states of a finished shard run.
FINISHED_RUN_STATES = ("success", "failed")


class TaskCounts(Protocol):
    """Where task-instance and DAG-run counts come from."""

    def ti_count(
        self, *, dag_id: str, run_ids: list[str], task_ids: list[str], states: list[str] | None
    ) -> int: ...

    def dr_count(self, *, dag_id: str, run_ids: list[str], states: list[str]) -> int: ...


#: The parent's tasks that start and wait for the shard runs: when all of their task instances
#: have finished, no shard run of the week is running or will start.
WINDOW_TASKS = ("canary", "shard_start", "shards")


@dataclass(frozen=True)
class TrackedRun:
    """A weekly run as the tracker sees it: where its artifacts are and which shard runs it has.

    JSON-able (:meth:`to_json`), so it travels in the trigger's arguments.
    """

    artifact_root: str
    run_key: str
    dag_id: str
    run_id: str
    shard_dag_id: str
    shard_count: int
    canary: bool = False
    window_task_ids: tuple[str, ...] = WINDOW_TASKS

    @classmethod
    def from_descriptor(
        cls, run: Mapping[str, Any], shard_dag_id: str, window_task_ids: Sequence[str] = WINDOW_TASKS
    ) -> TrackedRun:
        """From the run descriptor ``prepare`` pushes (XCom ``run``)."""
        from pydantic import ValidationError

        from avsim.contracts import RunDescriptor

        missing = sorted({"artifact_root", "run_key", "dag_id", "run_id", "shard_count"} - set(run))
        try:
            checked = RunDescriptor.model_validate(dict(run))
        except ValidationError as exc:
            missing = missing or [".".join(map(str, e["loc"])) for e in exc.errors()]
        if missing:
            raise AvsimError(
                f"the run descriptor given to the deadline tracker lacks {', '.join(missing)}; "
                "pass the XCom 'run' that the weekly DAG's prepare task pushes"
            )
        return cls(
            artifact_root=checked.artifact_root,
            run_key=checked.run_key,
            dag_id=checked.dag_id,
            run_id=checked.run_id,
            shard_dag_id=shard_dag_id,
            shard_count=checked.shard_count,
            canary=bool(checked.canary_count),
            window_task_ids=tuple(window_task_ids),
        )

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TrackedRun:
        return cls(**{**doc, "window_task_ids": tuple(doc.get("window_task_ids", WINDOW_TASKS))})

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "window_task_ids": list(self.window_task_ids)}

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.artifact_root, self.run_key)

    @property
    def shard_run_ids(self) -> list[str]:
        """The week's shard runs: the canary's (when it has one), then shards 1..n."""
        return week_run_ids(self.run_id, self.shard_count, canary=self.canary)


@dataclass(frozen=True)
class PhaseTasks:
    """The shard DAG's tasks of one phase: its task, and the on-demand twin a GPU phase may have.

    With a twin, the phase is done for a case when both have finished: the twin is skipped when the
    spot task succeeds, and runs (to its end) when the spot task hands the case over.
    """

    key: str
    upstream: tuple[str, ...] = ()
    twin: str | None = None

    @classmethod
    def from_json(cls, key: str, doc: Mapping[str, Any]) -> PhaseTasks:
        return cls(key, tuple(doc.get("upstream") or ()), doc.get("twin"))

    def to_json(self) -> dict[str, Any]:
        return {"upstream": list(self.upstream), "twin": self.twin}


def phase_tasks(plan: Any) -> dict[str, dict[str, Any]]:
    """The shard DAG's phase tasks of a :class:`~avsim.plan.model.WeeklyPlan`, JSON-able, by phase key.

    The key is the phase's task id, ``<family group>.<phase>``, as ``plan.json``'s ``per_phase`` has it.
    """
    out = {}
    for family in plan.families:
        for phase in family.phases:
            key = f"{family.group_id}.{phase.name}"
            twin = (
                f"{family.group_id}.{phase.on_demand_task}"
                if getattr(phase, "on_demand_fallback", False)
                else None
            )
            out[key] = PhaseTasks(
                key, tuple(f"{family.group_id}.{u}" for u in phase.upstream), twin
            ).to_json()
    return out


@dataclass(frozen=True)
class Pass:
    """What one tracking pass found."""

    estimate: Estimate
    shard_runs_finished: int
    done: bool
    document: dict[str, Any]


def load_planned_work(run: TrackedRun, phases: Mapping[str, PhaseTasks]) -> PlannedWork:
    """``manifest/plan.json`` of the run, read against the deployed phase graph."""
    from avsim.storage import exists, read_json

    uri = run.layout.plan_uri
    if not exists(uri):
        raise AvsimError(
            f"{uri} does not exist: the weekly run's prepare task writes it before the deadline "
            "tracker starts; check that the tracker runs after prepare"
        )
    graph = {key: list(p.upstream) for key, p in phases.items()}
    return PlannedWork.from_document(read_json(uri), graph, uri)


def read_progress(
    counts: TaskCounts, run: TrackedRun, phases: Mapping[str, PhaseTasks]
) -> dict[str, PhaseProgress]:
    """Finished, active and waiting cases of each phase over the week's shard runs."""
    run_ids = run.shard_run_ids

    def count(task_ids: list[str], states: Sequence[str]) -> int:
        return counts.ti_count(
            dag_id=run.shard_dag_id, run_ids=run_ids, task_ids=task_ids, states=list(states)
        )

    out = {}
    for key, p in phases.items():
        tasks = [key, p.twin] if p.twin else [key]
        # With a twin, finished when both have: a twin skipped beside a spot task cleared for a repair
        # stays skipped while the spot task runs again (the smaller count; both end together otherwise).
        finished = count([key], FINISHED_STATES)
        if p.twin:
            finished = min(finished, count([p.twin], FINISHED_STATES))
        out[key] = PhaseProgress(
            finished=finished,
            active=count(tasks, ACTIVE_STATES),
            waiting=count(tasks, WAITING_STATES),
        )
    return out


def window_state(counts: TaskCounts, run: TrackedRun) -> tuple[int, bool]:
    """(shard runs finished, whether the week's window is over).

    Over when every shard run finished, or when every task instance of the parent's window tasks
    finished: a shard run that could not be started, or a canary gate that stopped the week,
    ends there, and no shard run will follow.
    """
    expected = run.shard_run_ids
    finished = counts.dr_count(dag_id=run.shard_dag_id, run_ids=expected, states=list(FINISHED_RUN_STATES))
    if expected and finished >= len(expected):
        return finished, True
    window = list(run.window_task_ids)
    total = counts.ti_count(dag_id=run.dag_id, run_ids=[run.run_id], task_ids=window, states=None)
    ended = counts.ti_count(
        dag_id=run.dag_id, run_ids=[run.run_id], task_ids=window, states=list(FINISHED_STATES)
    )
    return finished, total > 0 and ended >= total


def record(
    run: TrackedRun, estimate: Estimate, *, status: str, shard_runs_finished: int, action: str
) -> dict[str, Any]:
    """Write ``deadline/latest.json`` and a ``deadline/history/`` entry; return the document."""
    from avsim.storage import write_json

    doc = {
        **estimate.to_json(),
        "status": status,
        "action": action,
        "run_key": run.run_key,
        "run_id": run.run_id,
        "shard_runs": {"total": len(run.shard_run_ids), "finished": shard_runs_finished},
    }
    write_json(run.layout.deadline_history(estimate.at.strftime("%Y%m%dT%H%M%S.%fZ")), doc)
    write_json(run.layout.deadline_latest, doc)
    return doc


def emit_metrics(estimate: Estimate) -> None:
    """The finish estimate's lateness always; the GPUs needed when the estimate passes the deadline."""
    from avsim import metrics

    if estimate.seconds_late is not None:
        metrics.finish_estimate(estimate.seconds_late)
    if estimate.late and estimate.gpus_needed is not None:
        metrics.gpus_needed(estimate.gpus_needed)


def track_once(
    counts: TaskCounts,
    run: TrackedRun,
    planned: PlannedWork,
    phases: Mapping[str, PhaseTasks],
    *,
    now: dt.datetime | None = None,
    gpu_capacity: int = 0,
    action: str = "none",
) -> Pass:
    """One pass: counts, the estimate, its documents in the artifact store, its metrics.

    ``action``: what the tracker last did about the deadline, as the documents report it.
    """
    now = now or dt.datetime.now(dt.UTC)
    finished_runs, done = window_state(counts, run)
    progress = read_progress(counts, run, phases)
    estimate = estimate_finish(planned, progress, now, gpu_capacity=gpu_capacity)
    status = "done" if done else ("late" if estimate.late else "tracking")
    doc = record(run, estimate, status=status, shard_runs_finished=finished_runs, action=action)
    emit_metrics(estimate)
    log.info(
        "deadline tracker %s: %s (finish %s, deadline %s, %d GPUs in use, %d of %d shard runs finished)",
        run.run_key,
        estimate.reason,
        estimate.estimated_finish.isoformat() if estimate.estimated_finish else "unknown",
        estimate.deadline.isoformat(),
        estimate.gpus_in_use,
        finished_runs,
        len(run.shard_run_ids),
    )
    return Pass(estimate, finished_runs, done, doc)
