"""The phase operators' side of the attempt service: Airflow's context in, Airflow's terms out.

A phase operator (:class:`avsim.operators.phase.LocalPhaseOperator`, the Kubernetes pod operator)
mixes in :class:`PhaseLifecycle` and calls two methods around the launch it implements,
:meth:`PhaseLifecycle.begin_attempt` and :meth:`PhaseLifecycle.end_attempt`. Both hand over to the
Airflow-free :class:`avsim.attempt.service.AttemptService`, which makes every decision; this adapter
only translates:

* in: the rendered fields into one :class:`~avsim.attempt.args.PhaseArgs`, the task instance into a
  :class:`~avsim.attempt.args.TryView`, the upstream phases' results (XCom) into the attempt's inputs;
* out: the service's answer (:mod:`avsim.attempt.steps`) into a return value, the exception
  :data:`~avsim.operators.exceptions.FAILURE_EXCEPTIONS` names, or the hand-over to the on-demand
  twin (its XCom and a skip); and the effects the service asks for on its way (the
  ``avsim_outcome`` XCom, readying the twin through the REST API).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from avsim import airflow_internals
from avsim.attempt import PhaseAttempt
from avsim.attempt.args import PhaseArgs, TryView, upstream_task_ids
from avsim.attempt.service import AttemptService, ResolvedInputs
from avsim.attempt.steps import Done, Ended, HandOver, Launch, Stop
from avsim.contracts import OUTCOME_XCOM_KEY, PhaseResult
from avsim.phases import policy
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, AttemptResult
from avsim.phases.policy import Role
from avsim.plan.model import ON_DEMAND_SUFFIX

if TYPE_CHECKING:
    import datetime as dt

    from airflow.sdk import Context

__all__ = ["HANDOVER_XCOM", "NODE_CPU", "NODE_ON_DEMAND", "NODE_SPOT", "AttemptResult", "PhaseLifecycle"]

#: The XCom a spot task leaves its on-demand twin when it hands a GPU phase over.
HANDOVER_XCOM = "avsim_handover"
#: States an earlier round can leave an on-demand twin in, from which it would never run again.
TWIN_LEFT_BEHIND = frozenset({"skipped", "failed", "upstream_failed", "success", "removed"})


class PhaseLifecycle:
    """Mixin for phase operators. Their constructors pass the phase keywords to :meth:`init_phase`,
    which keeps them as the operator's (templated) fields; :class:`PhaseArgs` is built from them,
    rendered, when the task runs (:attr:`service`)."""

    phase: str
    case: Any
    run: Any
    upstream_phases: Mapping[str, Sequence[str]]
    inputs: Any
    role: Role
    gpus: int
    task_id: str
    retries: int | None
    log: Any
    reuse_outputs: bool

    def init_phase(self, **keywords: Any) -> None:
        """Keep the phase keywords of :meth:`PhaseArgs.of` (all but ``task_id`` and ``retries``, the
        operator's own) as fields: ``case``, ``run`` and ``inputs`` are templated."""
        unknown = set(keywords) - PHASE_KEYWORDS
        if unknown:
            raise TypeError(f"unknown phase arguments: {sorted(unknown)}")
        for name, value in keywords.items():
            setattr(self, name, value)
        self.upstream_phases = upstream_task_ids(keywords.get("upstream_phases"))
        self.role = Role(keywords.get("role", Role.REGULAR))

    @property
    def node_class(self) -> str:
        return policy.node_class_for(self.gpus, Role(self.role))

    def phase_args(self) -> PhaseArgs:
        """The task's phase arguments, from its fields as rendered."""
        return PhaseArgs.of(
            phase=self.phase,
            case=self.case,
            run=self.run,
            task_id=self.task_id,
            upstream_phases=self.upstream_phases,
            inputs=self.inputs,
            role=self.role,
            gpus=self.gpus,
            reuse_outputs=self.reuse_outputs,
            retries=self.retries,
        )

    @cached_property
    def service(self) -> AttemptService:
        """The attempt service of this task (built when first used: after the fields are rendered)."""
        from avsim import metrics

        return AttemptService(self.phase_args(), meter=metrics, log=self.log)

    def try_view(self, ti: Any) -> TryView:
        return TryView(
            try_number=int(ti.try_number),
            max_tries=int(getattr(ti, "max_tries", self.retries or 0) or 0),
            map_index=int(getattr(ti, "map_index", -1)),
        )

    def _where(self, attempt: int | None = None) -> str:
        return f"phase {self.phase!r} of case {dict(self.case or {}).get('case_id')!r}" + (
            f" (attempt {attempt})" if attempt else ""
        )

    # -- in ---------------------------------------------------------------------------------------
    def resolve_inputs(self, context: Context) -> ResolvedInputs:
        """Upstream phase -> committed output URI, and -> its cache key, from the upstream results."""
        if self.inputs:
            return ResolvedInputs(dict(self.inputs))
        ti = context["ti"]
        uris: dict[str, str] = {}
        keys: dict[str, str] = {}
        for up_phase, task_ids in self.upstream_phases.items():
            value: PhaseResult | None = None
            for task_id in task_ids:  # a spot task and its on-demand twin: one of them produced it
                found = airflow_internals.pulled_xcom(
                    ti.xcom_pull(task_ids=task_id, map_indexes=ti.map_index)
                )
                if isinstance(found, dict) and found.get("output_uri"):
                    value = PhaseResult.model_validate(found)
                    break
            if value is None:
                from avsim.operators.exceptions import PhaseBadInput

                raise PhaseBadInput(
                    f"{self._where()}: upstream phase {up_phase!r} ({', '.join(task_ids)}) left no committed output"
                )
            uris[up_phase] = value.output_uri
            keys[up_phase] = value.cache_key
        return ResolvedInputs(uris, keys)

    def attempt_for(
        self, context: Context, number: int = 0, resolved: tuple[Mapping[str, str], str] | None = None
    ) -> tuple[PhaseAttempt, str]:
        """The phase's attempt ``number`` (0: not claimed yet) and its cache key. A deferred operator
        that resumes rebuilds its attempt from the inputs and cache key it ``resolved`` before it
        deferred (no upstream XCom read again)."""
        if resolved is not None:
            attempt = self.service.attempt_for(ResolvedInputs(dict(resolved[0])), number, resolved[1])
        else:
            attempt = self.service.attempt_for(self.resolve_inputs(context), number)
        return attempt, attempt.cache_key

    def take_over(self, context: Context) -> None:
        """An on-demand twin takes the case and the run its spot task handed over (the twin has no other
        upstream, so its trigger rule can say "run only when the spot task handed over")."""
        if self.role is not Role.ON_DEMAND:
            return
        ti = context["ti"]
        spot = self.task_id[: -len(ON_DEMAND_SUFFIX)]
        handed = ti.xcom_pull(task_ids=spot, key=HANDOVER_XCOM, map_indexes=ti.map_index)
        if not isinstance(handed, dict) or "case" not in handed or "run" not in handed:
            from avsim.errors import AvsimError

            raise AvsimError(
                f"{self.task_id}: no hand-over from {spot} for map index {ti.map_index}; the twin runs only "
                f"after its spot task handed over: clear {spot} (with Downstream) instead"
            )
        self.case, self.run = handed["case"], handed["run"]
        self.__dict__.pop("service", None)

    # -- the service's way -------------------------------------------------------------------------
    def begin_attempt(self, context: Context) -> PhaseAttempt | dict[str, Any]:
        """The claimed attempt to launch, or the phase's committed result (a dict) when there is nothing
        to launch. Raises when the phase must fail without launching."""
        ti = context["ti"]
        begun = self.service.begin(self.try_view(ti), self.resolve_inputs(context), _TaskSide(self, ti))
        if isinstance(begun, Launch):
            return begun.attempt
        return self._finish(ti, begun)

    def end_attempt(
        self, context: Context, attempt: PhaseAttempt, result: AttemptResult, started: dt.datetime
    ) -> dict[str, Any]:
        """Record and classify the attempt's end: return the phase's result or raise by class."""
        return self._finish(context["ti"], self.record_end(context, attempt, result, started))

    def record_end(
        self, context: Context, attempt: PhaseAttempt, result: AttemptResult, started: dt.datetime
    ) -> Ended:
        """Record the attempt's end behind the ledger's fence and decide; nothing raised but
        :class:`~avsim.ledger.store.AttemptSuperseded` (a newer try owns the phase)."""
        ti = context["ti"]
        return self.service.end(self.try_view(ti), attempt, result, started, _TaskSide(self, ti))

    def finish(self, context: Context, ended: Ended) -> dict[str, Any]:
        """The task's end for a decision :meth:`record_end` took: its return value, or the exception."""
        return self._finish(context["ti"], ended)

    def _finish(self, ti: Any, ended: Ended) -> dict[str, Any]:
        """The task's end in Airflow's terms: the result as its return value, or the exception."""
        if isinstance(ended, Done):
            return ended.xcom()
        if isinstance(ended, HandOver):
            from avsim.operators.exceptions import PhaseFallbackToOnDemand

            ti.xcom_push(key=HANDOVER_XCOM, value={"case": ended.case, "run": ended.run})
            raise PhaseFallbackToOnDemand(ended.message)
        raise stop_exception(ended)

    def _ready_the_twin(self, ti: Any) -> None:
        """Make sure the on-demand twin runs once this spot task ends skipped.

        The twin runs when its only upstream, this task, was skipped (``all_skipped``). When this task
        failed in an earlier round (its budget, a bad build), Airflow skipped the twin; a repair clears
        failed task instances only, so that twin stays skipped, never runs after a hand-over in the
        repair's round, and the case's next phase finds no output. Such a twin is cleared here, through
        the REST API (``[avsim] airflow_api_conn_id``), before the hand-over. A twin not yet decided
        (the first round) needs nothing, and is read with one execution-API call.
        """
        twin = f"{self.task_id}{ON_DEMAND_SUFFIX}"
        map_index = int(getattr(ti, "map_index", -1))
        state = airflow_internals.task_instance_state(ti, ti.dag_id, ti.run_id, twin, map_index)
        if state not in TWIN_LEFT_BEHIND:
            return
        from airflow.sdk.exceptions import AirflowNotFoundException

        from avsim.hooks.airflow_api import AirflowApiError, AirflowApiHook
        from avsim.settings import load_settings

        conn_id = load_settings().airflow_api_conn_id
        try:
            AirflowApiHook(conn_id).clear_task_instances(
                ti.dag_id,
                ti.run_id,
                only_failed=False,
                include_downstream=False,
                task_ids=[(twin, map_index)],
                reset_dag_runs=False,
                note=f"readied for the hand-over of {self.task_id} (try {ti.try_number})",
            )
        except (AirflowApiError, AirflowNotFoundException) as exc:
            from avsim.operators.exceptions import RepairFailed

            raise RepairFailed(
                f"{self._where()}: must hand over to {twin}, which an earlier round left {state}, and could "
                f"not clear it: {exc}. Clear {twin} (map index {map_index}) and this task, or check the "
                f"connection {conn_id!r} ([avsim] airflow_api_conn_id)"
            ) from None
        self.log.warning(
            "%s: cleared %s (left %s by an earlier round) so it takes the hand-over",
            self._where(),
            twin,
            state,
        )


#: The phase keywords an operator keeps as fields (:meth:`PhaseLifecycle.init_phase`): PhaseArgs's
#: fields but the operator's own ``task_id`` and ``retries``.
PHASE_KEYWORDS = frozenset(f.name for f in dataclasses.fields(PhaseArgs)) - {"task_id", "retries"}


class _TaskSide:
    """The service's effects on Airflow's side, for one try (:class:`avsim.attempt.steps.TaskSide`)."""

    def __init__(self, op: PhaseLifecycle, ti: Any) -> None:
        self.op, self.ti = op, ti

    def publish(self, result: PhaseResult) -> None:
        self.ti.xcom_push(key=OUTCOME_XCOM_KEY, value=result.to_json())

    def ready_twin(self) -> None:
        self.op._ready_the_twin(self.ti)


def stop_exception(stop: Stop) -> Exception:
    """The exception a task raises for ``stop``: its failure's class, with its delay when retriable."""
    from avsim.operators.exceptions import FAILURE_EXCEPTIONS, PhaseRetriable

    cls = FAILURE_EXCEPTIONS[stop.failure]
    if stop.retry_delay is not None:
        assert issubclass(cls, PhaseRetriable), cls
        return cls(stop.message, retry_delay=stop.retry_delay)
    return cls(stop.message)
