"""Admission as a ``shard_start`` task applies it: count the week, start now or name the trigger to wait on.

:class:`AdmissionGate` is a component the start operator holds; the decision is
:func:`avsim.plan.admission.admit`, the counts :mod:`avsim.plan.week_counts`, the wait
:class:`avsim.triggers.admission.ShardAdmissionTrigger` (docs/design.md, "Admission by cases in flight").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from avsim.contracts import AdmissionPlan, RunDescriptor
    from avsim.plan.week_counts import WeekCounts, WeekShape
    from avsim.triggers.admission import RunToStart, ShardAdmissionTrigger

log = logging.getLogger(__name__)

#: How long a start task counts again in the worker, while it must wait, before it defers: the start
#: tasks run together, and an earlier one is usually creating its run that second.
PATIENCE_SECONDS = 6.0
#: Seconds between those counts (each is three state reads: :func:`avsim.plan.week_counts.read_in_flight`).
PATIENCE_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class AdmissionGate:
    """Where one week's admission reads its figures: the tasks whose end is a case's end per graph
    family, the pools the target follows, W when admitting by window, and the start task's id."""

    #: Per graph family, the tasks whose end is a case's end (:func:`avsim.plan.week_counts.case_end_tasks`).
    case_ends: tuple[tuple[str, ...], ...] = ()
    #: Of them, the CPU phases' (:func:`avsim.plan.week_counts.cpu_end_tasks`).
    cpu_ends: tuple[str, ...] = ()
    #: Where the pools' slots are read (REST connection, GPU spot pool, CPU pool); empty: the target
    #: prepared is kept.
    pools: tuple[str, ...] = ()
    #: ``[avsim] admission = window``: W, the most shard runs in progress (0: admit by cases).
    window: int = 0
    #: The mapped task that starts the shard runs (map index k - 1 is shard k).
    start_task_id: str = ""
    #: Seconds between the waiting trigger's counts.
    poll_interval: float = 60.0
    #: How long the task counts again itself before it defers (:data:`PATIENCE_SECONDS`).
    patience_seconds: float = PATIENCE_SECONDS

    @classmethod
    def of(
        cls,
        case_ends: Sequence[Sequence[str]],
        pools: Sequence[str],
        window: int,
        start_task_id: str,
        poll_interval: float,
        cpu_ends: Sequence[str] = (),
    ) -> AdmissionGate:
        return cls(
            case_ends=tuple(tuple(t) for t in case_ends),
            cpu_ends=tuple(cpu_ends),
            pools=tuple(pools),
            window=int(window),
            start_task_id=start_task_id,
            poll_interval=float(poll_interval),
        )

    def target(self, plan: AdmissionPlan) -> int:
        """The week's cases in flight now, from the pools' slots now (the prepared target when they
        cannot be read: admission never stops a week for want of a pool reading)."""
        from avsim.plan.admission import week_target
        from avsim.pools import api_pool_slots

        spot = cpus = None
        if self.pools and not plan.configured:
            try:
                spot, cpus = api_pool_slots(*self.pools)
            except Exception as exc:
                log.warning(
                    "the pools' slots could not be read (%s): target %d as prepared", exc, plan.target
                )
        return week_target(plan, spot, cpus)

    def week_of(self, run: RunDescriptor, *, dag_id: str, run_id: str, shard_dag_id: str) -> WeekShape | None:
        """The week as admission sees it; None when it admits every shard at once."""
        from avsim.plan.week_counts import WeekShape

        return WeekShape.of_run(
            run,
            dag_id=dag_id,
            run_id=run_id,
            shard_dag_id=shard_dag_id,
            shards_task_id=self.start_task_id,
            case_ends=self.case_ends,
            cpu_ends=self.cpu_ends,
            window=self.window,
        )

    def wait_trigger(
        self,
        run: RunDescriptor,
        shard: int,
        week: WeekShape | None,
        start: RunToStart | None = None,
        counts: WeekCounts | None = None,
    ) -> ShardAdmissionTrigger | None:
        """None when shard ``shard`` may start now; else the trigger to defer on until it may, which
        creates ``start`` itself once admitted. The canary and a week with neither admission nor a
        window start at once."""
        from avsim.plan.week_counts import ExecutionApiCounts, decide_now
        from avsim.triggers.admission import ShardAdmissionTrigger

        if shard < 1 or week is None:
            return None
        target = self.target(run.admission) if run.admission is not None else self.window
        try:
            decision = decide_now(
                counts or ExecutionApiCounts(),
                week,
                shard,
                target,
                patience_seconds=self.patience_seconds,
                poll_seconds=min(PATIENCE_POLL_SECONDS, self.poll_interval),
            )
        except Exception as exc:
            # A passing API failure: the trigger counts again (five failures in a row fail the task).
            log.warning("counting the week's cases failed (%s): the trigger counts again", exc)
        else:
            if decision.admitted:
                log.info("admitted: %s", decision.reason)
                return None
            log.info("waiting for room: %s", decision.reason)
        return ShardAdmissionTrigger(
            week=week.to_json(),
            shard=shard,
            target=target,
            poll_interval=self.poll_interval,
            start=None if start is None else dataclasses.asdict(start),
        )


def admission_failed(shard: Any, event: dict[str, Any]) -> Exception | None:
    """The error a start task raises when its admission trigger could not count the week."""
    if event.get("status") != "error":
        return None
    from avsim.errors import AvsimError

    return AvsimError(
        f"shard {shard}: the week's cases could not be counted ({event.get('message')}); the execution "
        "API is unreachable from the triggerer: the task's retries wait for it, or clear this task when "
        "it is back"
    )
