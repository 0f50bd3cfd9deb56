"""A Kubernetes phase whose pod passed ends in the triggerer: no worker resumes it.

:class:`PassCommitTrigger` is the pod trigger with one seam filled (``end_here``): when the pod
passed, it does what the resumed phase would have done (:func:`commit_passed`, through the attempt
service) and ends the task instance with Airflow's ``TaskSuccessEvent``; every other end, and a
commit it cannot make, resumes the phase in a worker. Why, and how it stays exactly once: the design
document's "A passed phase ends in the triggerer".
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from avsim.attempt.args import PhaseArgs, ResolvedInputs, TryView
from avsim.attempt.service import AttemptService
from avsim.attempt.steps import Done, MissingOutputs, NoTaskSide
from avsim.contracts import PassCommit
from avsim.contracts.pod import PodEvent
from avsim.phases.contract import AttemptResult, Outcome
from avsim.triggers.phase_pod import PhasePodTrigger

__all__ = ["MissingOutputs", "PassCommitTrigger", "commit_passed", "committed_result"]

log = logging.getLogger(__name__)


def _service(plan: PassCommit) -> AttemptService:
    """The attempt service with the deferred task's phase arguments, as its PassCommit carries them."""
    from avsim import metrics

    args = PhaseArgs.of(
        phase=plan.phase,
        case=plan.case,
        run=plan.run,
        task_id=plan.task_id,
        role=plan.role,
        gpus=plan.gpus,
    )
    return AttemptService(args, meter=metrics, log=log)


def commit_passed(plan: PassCommit, result: AttemptResult) -> dict[str, Any]:
    """End a passed attempt as the worker would (:meth:`AttemptService.end`, committing passes only);
    return the phase's result (the task instance's return value), which is the phase's first commit
    (an earlier one, if any, wins). Raises when the end is not the trigger's to make: outputs missing
    (:class:`~avsim.attempt.steps.MissingOutputs`, a failure with a retry decision), or a newer try
    owns the phase (:class:`avsim.ledger.store.AttemptSuperseded`)."""
    service = _service(plan)
    attempt = service.attempt_for(ResolvedInputs({}), plan.attempt, plan.cache_key)
    tv = TryView(try_number=plan.try_number, max_tries=plan.try_number, round_first=plan.round_start)
    started = dt.datetime.fromisoformat(plan.started_at)
    done = service.end(tv, attempt, result, started, NoTaskSide(), passes_only=True)
    assert isinstance(done, Done), done  # a pass is committed, or the commit that stands is returned
    return done.xcom()


def committed_result(plan: PassCommit) -> dict[str, Any] | None:
    """The phase's result when ``plan``'s attempt already committed it (a trigger that runs again after
    it committed), else None."""
    done = _service(plan).committed_pass(plan.attempt)
    return done.xcom() if done is not None else None


class PassCommitTrigger(PhasePodTrigger):
    """:class:`avsim.triggers.phase_pod.PhasePodTrigger` that ends a passed attempt itself.

    :param commit: a :class:`avsim.contracts.PassCommit` as JSON; every other argument is the base's.
    """

    def __init__(self, *, commit: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commit = commit

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "commit": self.commit}

    async def end_here(self, event: PodEvent) -> TriggerEvent | None:
        """The task's end when this trigger commits the attempt (or had committed it), else None:
        the event resumes the phase in a worker."""
        try:
            plan = PassCommit.model_validate(self.commit)
            result = event.result()
            if result is None or result.outcome is not Outcome.PASSED:
                value = await asyncio.to_thread(committed_result, plan)
                if value is None:
                    return None
                log.warning(
                    "%s: attempt %d had committed already; ending the task", self.pod_name, self.attempt
                )
            else:
                value = await asyncio.to_thread(commit_passed, plan, result)
        except Exception as exc:  # the worker commits it, as it does without this trigger
            log.warning(
                "%s: could not commit here (%s: %s); the phase resumes in a worker",
                self.pod_name,
                type(exc).__name__,
                exc,
            )
            return None
        try:
            await self.delete_attempt()
        except Exception as exc:  # committed: a pod left behind is clutter, not a wrong result
            log.warning(
                "%s: committed, but could not delete the pod: %s: %s", self.pod_name, type(exc).__name__, exc
            )
        from airflow.sdk.bases.xcom import BaseXCom

        return TaskSuccessEvent(xcoms={BaseXCom.XCOM_RETURN_KEY: value})
