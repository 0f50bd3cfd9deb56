"""A Kubernetes phase whose pod passed ends in the triggerer: no worker resumes it.

A deferred phase resumes in a worker when its trigger fires: a second task process, which parses the
DAG file, rebuilds the operator, renders it and talks to the execution API, to record the attempt,
commit its output and delete its pod. For a phase that failed that is where the decision belongs
(retry, hand over, fail fast, with the round's history). For a passed one there is no decision: the
output is committed, whatever came before it. So the operator hands its trigger a
:class:`avsim.contracts.PassCommit` when it defers, and the trigger, when the pod passed, does what
the resumed phase would have done here
(:func:`commit_passed`: the check of its declared outputs, the fence, the attempt's record, its metrics
and the breaker's window, the commit, the cache) and ends the task instance with Airflow's ``TaskSuccessEvent``, the phase's result as its
return value. Every other end, and a commit that fails here, fires the ordinary event: the phase
resumes in a worker as before; so does a scenario the driving software failed (a result too, but the
progress page tells it from a pass by its XCom, which a trigger's XComs do not reach as JSON it can
query, see :func:`avsim.airflow_internals.pulled_xcom`).

Exactly once: an attempt's end is recorded, counted and fed to the breaker only by the side that
still owns it (:meth:`avsim.ledger.store.Ledger.end_attempt`), and the ledger's first commit of a
phase wins (:meth:`avsim.ledger.store.Ledger.commit`); a second triggerer running the same trigger
returns the commit without counting it again, a stale trigger after a newer try records nothing, and
a trigger restarted after it committed (its triggerer died before Airflow took the event) finds the
commit (:func:`committed_result`) and ends the task with it, without committing again. A pass whose
declared outputs are missing is not the trigger's: the worker classes it ``infra_failed``.

:class:`PassCommitTrigger` is the pod trigger with that end (its seam ``end_here``). It lives here,
beside the lifecycle it runs, not in :mod:`avsim.triggers`, which the operators import.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from avsim.attempt import PhaseAttempt
from avsim.contracts import PassCommit
from avsim.errors import AvsimError
from avsim.operators.lifecycle import PhaseLifecycle
from avsim.phases.contract import AttemptResult, Outcome
from avsim.phases.policy import Role
from avsim.triggers.phase_pod import PhasePodTrigger

log = logging.getLogger(__name__)


def pass_commit(op: PhaseLifecycle, context: Any, attempt: PhaseAttempt, started: dt.datetime) -> PassCommit:
    """What ``op``'s trigger needs to commit ``attempt`` when its pod passes."""
    ti = context["ti"]
    return PassCommit(
        run=op.descriptor,
        case=dict(op.case),
        phase=op.phase,
        task_id=op.task_id,
        role=op.role.value,
        gpus=attempt.runtime.gpus,
        node_class=op.node_class,
        attempt=attempt.attempt,
        output_uri=attempt.output_uri,
        cache_key=attempt.cache_key,
        try_number=int(ti.try_number),
        round_start=op.round_start(ti),
        started_at=started.isoformat(),
    )


class MissingOutputs(AvsimError):
    """The pod passed but its declared outputs are missing: an infrastructure failure, which the worker
    decides (retry within the infrastructure budget); the trigger records nothing."""


class _CommitSide(PhaseLifecycle):
    """The phase lifecycle as the trigger runs it: the operator's phase arguments from a PassCommit."""

    def __init__(self, plan: PassCommit) -> None:
        self.plan = plan
        self.phase = plan.phase
        self.case = dict(plan.case)
        self.run = plan.run.to_json()
        self.task_id = plan.task_id
        self.role = Role(plan.role)
        self.gpus = plan.gpus
        self.node_class = plan.node_class
        self.upstream_phases = {}
        self.inputs = None
        self.retries = None
        self.reuse_outputs = True
        self.log = log

    def commit_passed(self, result: AttemptResult) -> dict[str, Any]:
        """Check the attempt's outputs, fence, record, measure and commit a passed attempt (the order
        :meth:`PhaseLifecycle.end_attempt` keeps); the phase's result. Raises when the end is not the
        trigger's to make: outputs missing (:class:`MissingOutputs`, a failure with a retry decision),
        or a newer try owns the phase (:class:`avsim.ledger.store.AttemptSuperseded`)."""
        plan = self.plan
        if result.outcome is not Outcome.PASSED:
            raise ValueError(
                f"{plan.task_id}: the trigger commits passed attempts only, not {result.outcome.value}"
            )
        checked, result_doc = self._outputs_checked(result, plan.output_uri)
        if checked.outcome is not Outcome.PASSED:  # nothing recorded: the worker decides the retry
            raise MissingOutputs(f"{plan.task_id} attempt {plan.attempt}: {checked.detail}: {checked.reason}")
        rec = self._ended_record(
            case_id=str(plan.case["case_id"]),
            attempt=plan.attempt,
            output_uri=plan.output_uri,
            gpus=plan.gpus,
            try_number=plan.try_number,
            round_start=plan.round_start,
            result=result,
            started=dt.datetime.fromisoformat(plan.started_at),
        )
        settled = self._record_ended(rec, plan.gpus)
        if settled is not None:
            return self._xcom(settled)
        return self._commit(rec, result, plan.cache_key, result_doc)

    def committed_result(self) -> dict[str, Any] | None:
        found = self.ledger.outcome(str(self.plan.case["case_id"]), self.phase)
        if found is None or found.attempt != self.plan.attempt or found.outcome is not Outcome.PASSED:
            return None
        return self._xcom(found)


def commit_passed(plan: PassCommit, result: AttemptResult) -> dict[str, Any]:
    """Record and commit a passed attempt; return the phase's result (the task instance's return
    value), which is the phase's first commit (an earlier one, if any, wins)."""
    return _CommitSide(plan).commit_passed(result)


def committed_result(plan: PassCommit) -> dict[str, Any] | None:
    """The phase's result when ``plan``'s attempt already committed it (a trigger that runs again after
    it committed), else None."""
    return _CommitSide(plan).committed_result()


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

    async def end_here(self, event: dict[str, Any]) -> TriggerEvent | None:
        """The task's end when this trigger commits the attempt (or had committed it), else None:
        the event resumes the phase in a worker."""
        try:
            plan = PassCommit.model_validate(self.commit)
            outcome = Outcome(str(event.get("outcome"))) if event.get("status") == "ended" else None
            if outcome is not Outcome.PASSED:
                value = await asyncio.to_thread(committed_result, plan)
                if value is None:
                    return None
                log.warning(
                    "%s: attempt %d had committed already; ending the task", self.pod_name, self.attempt
                )
            else:
                result = AttemptResult(
                    outcome,
                    event.get("exit_code"),
                    str(event.get("reason") or ""),
                    str(event.get("detail") or ""),
                    self.pod_name,
                )
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
