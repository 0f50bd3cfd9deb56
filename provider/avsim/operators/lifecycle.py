"""The phase operators' side of the attempt service: Airflow's context in, Airflow's terms out.

Both phase operators take the phase's arguments as keywords (:func:`phase_keywords`) and hold a
:class:`PhaseLifecycle` for the try that runs, built from their rendered fields. It runs the one
sequence of a phase task (:meth:`PhaseLifecycle.execute`: begin, the backend's launch and watch,
end) and translates the Airflow-free :class:`avsim.attempt.service.AttemptService`'s answers into a
return value, the exception :data:`~avsim.operators.exceptions.FAILURE_EXCEPTIONS` names, or the
hand-over to the on-demand twin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from avsim import airflow_internals
from avsim.attempt import PhaseAttempt
from avsim.attempt.args import OPERATOR_FIELDS, PhaseArgs, TryView
from avsim.attempt.service import AttemptService, ResolvedInputs
from avsim.attempt.steps import Done, Ended, HandOver, Launch, Stop
from avsim.contracts import OUTCOME_XCOM_KEY, PassCommit, PhaseResult
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, AttemptResult
from avsim.phases.policy import Role
from avsim.plan.model import ON_DEMAND_SUFFIX

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "HANDOVER_XCOM",
    "NODE_CPU",
    "NODE_ON_DEMAND",
    "NODE_SPOT",
    "AttemptResult",
    "Backend",
    "HeldLifecycle",
    "PhaseLifecycle",
    "phase_keywords",
]

#: The XCom a spot task leaves its on-demand twin when it hands a GPU phase over.
HANDOVER_XCOM = "avsim_handover"
#: States an earlier round can leave an on-demand twin in, from which it would never run again.
TWIN_LEFT_BEHIND = frozenset({"skipped", "failed", "upstream_failed", "success", "removed"})

#: The operators' keyword parameters for :class:`PhaseArgs`'s fields (a default factory's is None).
_PHASE_PARAMETERS = [
    inspect.Parameter(
        f.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty,
    )
    if f.default_factory is dataclasses.MISSING
    else inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None)
    for f in OPERATOR_FIELDS
]
_PHASE_NAMES = tuple(f.name for f in OPERATOR_FIELDS)


def phase_keywords(init: Callable[..., None]) -> Callable[..., None]:
    """An operator's ``__init__`` that also takes :class:`PhaseArgs`'s fields (but ``task_id`` and
    ``retries``, the operator's own) as keywords and keeps them as the operator's fields, which
    Airflow renders (``case``, ``run`` and ``inputs`` are templated). Its signature names them, so
    Airflow's ``partial``/``expand`` check them as any operator's keywords."""
    own = list(inspect.signature(init).parameters.values())
    variadic = [p for p in own if p.kind is inspect.Parameter.VAR_KEYWORD]
    named = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]

    @functools.wraps(init)
    def __init__(self: Any, **kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in _PHASE_NAMES if name in kwargs}
        missing = [p.name for p in _PHASE_PARAMETERS if p.default is p.empty and p.name not in given]
        if missing:
            raise TypeError(f"missing phase arguments: {missing}")
        init(self, **kwargs)
        defaults = {p.name: p.default for p in _PHASE_PARAMETERS if p.default is not p.empty}
        for name, value in {**defaults, **given}.items():
            setattr(self, name, value)
        self.role = Role(self.role)

    __init__.__signature__ = inspect.Signature([*named, *_PHASE_PARAMETERS, *variadic])  # type: ignore[attr-defined]
    return __init__


class HeldLifecycle:
    """An operator's :class:`PhaseLifecycle`: the one its task set when it ran or resumed (with an
    on-demand twin's hand-over taken), else one built from its fields as they are."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    def __get__(self, op: Any, owner: type | None = None) -> Any:
        if op is None:
            return self
        held = op.__dict__.get(self.slot)
        if held is None:
            held = op.__dict__[self.slot] = PhaseLifecycle.of(op)
        return held

    def __set__(self, op: Any, lifecycle: PhaseLifecycle) -> None:
        op.__dict__[self.slot] = lifecycle


class Backend(Protocol):
    """What a backend supplies to :meth:`PhaseLifecycle.execute`: the launch, and the watch until the
    attempt ends."""

    def runs(self, attempt: PhaseAttempt) -> str:
        """What runs ``attempt``, in the log's words."""
        ...

    def launch(self, attempt: PhaseAttempt, started: dt.datetime, context: Context) -> AttemptResult:
        """Run the claimed ``attempt`` and watch it until it ends: how it ended."""
        ...


class PhaseLifecycle:
    """One try of a phase task, in Airflow's terms, over its :class:`AttemptService`.

    :param args: the task's phase arguments, rendered.
    :param log: the task's logger.
    """

    def __init__(self, args: PhaseArgs, log: Any) -> None:
        self.args = args
        self.log = log

    @classmethod
    def of(cls, op: Any, context: Context | None = None) -> PhaseLifecycle:
        """The lifecycle of operator ``op``'s task, from its fields as rendered. With ``context``, an
        on-demand twin first takes the case and the run its spot task handed over (the twin has no
        other upstream, so its trigger rule can say "run only when the spot task handed over")."""
        fields = {name: getattr(op, name) for name in _PHASE_NAMES}
        if context is not None and Role(fields["role"]) is Role.ON_DEMAND:
            handed = handed_over(str(op.task_id), context["ti"])
            fields.update(handed)
            # The task's own fields too: its map index label renders ``task.case.case_id`` after the try.
            op.case, op.run = handed["case"], handed["run"]
        return cls(PhaseArgs.of(**fields, task_id=op.task_id, retries=op.retries), op.log)

    @cached_property
    def service(self) -> AttemptService:
        """The attempt service of this task."""
        from avsim import metrics

        return AttemptService(self.args, meter=metrics, log=self.log)

    def try_view(self, ti: Any) -> TryView:
        return TryView(
            try_number=int(ti.try_number),
            max_tries=int(getattr(ti, "max_tries", self.args.retries or 0) or 0),
            map_index=int(getattr(ti, "map_index", -1)),
        )

    def execute(self, context: Context, backend: Backend) -> dict[str, Any]:
        """A phase task's one sequence: begin the attempt, let ``backend`` launch and watch it, end it.
        Returns the phase's result; raises by class, or to defer (the backend's launch)."""
        begun = self.begin_attempt(context)
        if isinstance(begun, dict):
            return begun
        started = dt.datetime.now(dt.UTC)
        self.log.info(
            "avsim phase %s of case %s, attempt %d on %s: %s",
            begun.phase,
            begun.case_id,
            begun.attempt,
            self.args.node_class,
            backend.runs(begun),
        )
        result = backend.launch(begun, started, context)
        return self.end_attempt(context, begun, result, started)

    # -- in ---------------------------------------------------------------------------------------
    def resolve_inputs(self, context: Context) -> ResolvedInputs:
        """Upstream phase -> committed output URI, and -> its cache key, from the upstream results."""
        if self.args.inputs:
            return ResolvedInputs(dict(self.args.inputs))
        ti = context["ti"]
        uris: dict[str, str] = {}
        keys: dict[str, str] = {}
        for up_phase, task_ids in self.args.upstream_phases.items():
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
                    f"{self.args.where()}: upstream phase {up_phase!r} ({', '.join(task_ids)}) left no committed output"
                )
            uris[up_phase] = value.output_uri
            keys[up_phase] = value.cache_key
        return ResolvedInputs(uris, keys)

    def attempt_for(
        self, context: Context, number: int = 0, resolved: tuple[Mapping[str, str], str] | None = None
    ) -> PhaseAttempt:
        """The phase's attempt ``number`` (0: not claimed yet). A deferred operator that resumes
        rebuilds its attempt from the inputs and cache key it ``resolved`` before it deferred (no
        upstream XCom read again)."""
        if resolved is not None:
            return self.service.attempt_for(ResolvedInputs(dict(resolved[0])), number, resolved[1])
        return self.service.attempt_for(self.resolve_inputs(context), number)

    def pass_commit(self, context: Context, attempt: PhaseAttempt, started: dt.datetime) -> PassCommit:
        """What the committing trigger needs to end ``attempt`` when its pod passes."""
        args = self.args
        tv = self.try_view(context["ti"])
        return PassCommit(
            run=self.service.books.descriptor,
            case=args.case.to_json(),
            phase=args.phase,
            task_id=args.task_id,
            role=args.role.value,
            gpus=attempt.runtime.gpus,
            node_class=args.node_class,
            attempt=attempt.attempt,
            output_uri=attempt.output_uri,
            cache_key=attempt.cache_key,
            try_number=tv.try_number,
            round_start=tv.round_start(args.retries),
            started_at=started.isoformat(),
        )

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

    def ready_twin(self, ti: Any) -> None:
        """Make sure the on-demand twin runs once this spot task ends skipped.

        The twin runs when its only upstream, this task, was skipped (``all_skipped``). When this task
        failed in an earlier round (its budget, a bad build), Airflow skipped the twin; a repair clears
        failed task instances only, so that twin stays skipped, never runs after a hand-over in the
        repair's round, and the case's next phase finds no output. Such a twin is cleared here, through
        the REST API (``[avsim] airflow_api_conn_id``), before the hand-over. A twin not yet decided
        (the first round) needs nothing, and is read with one execution-API call.
        """
        task_id = self.args.task_id
        twin = f"{task_id}{ON_DEMAND_SUFFIX}"
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
                note=f"readied for the hand-over of {task_id} (try {ti.try_number})",
            )
        except (AirflowApiError, AirflowNotFoundException) as exc:
            from avsim.operators.exceptions import RepairFailed

            raise RepairFailed(
                f"{self.args.where()}: must hand over to {twin}, which an earlier round left {state}, and could "
                f"not clear it: {exc}. Clear {twin} (map index {map_index}) and this task, or check the "
                f"connection {conn_id!r} ([avsim] airflow_api_conn_id)"
            ) from None
        self.log.warning(
            "%s: cleared %s (left %s by an earlier round) so it takes the hand-over",
            self.args.where(),
            twin,
            state,
        )


def handed_over(task_id: str, ti: Any) -> dict[str, Any]:
    """The case and the run the spot task of on-demand twin ``task_id`` handed over (its XCom)."""
    spot = task_id[: -len(ON_DEMAND_SUFFIX)]
    handed = ti.xcom_pull(task_ids=spot, key=HANDOVER_XCOM, map_indexes=ti.map_index)
    if not isinstance(handed, dict) or "case" not in handed or "run" not in handed:
        from avsim.errors import AvsimError

        raise AvsimError(
            f"{task_id}: no hand-over from {spot} for map index {ti.map_index}; the twin runs only "
            f"after its spot task handed over: clear {spot} (with Downstream) instead"
        )
    return {"case": handed["case"], "run": handed["run"]}


class _TaskSide:
    """The service's effects on Airflow's side, for one try (:class:`avsim.attempt.steps.TaskSide`)."""

    def __init__(self, op: PhaseLifecycle, ti: Any) -> None:
        self.op, self.ti = op, ti

    def publish(self, result: PhaseResult) -> None:
        self.ti.xcom_push(key=OUTCOME_XCOM_KEY, value=result.to_json())

    def ready_twin(self) -> None:
        self.op.ready_twin(self.ti)


def stop_exception(stop: Stop) -> Exception:
    """The exception a task raises for ``stop``: its failure's class, with its delay when retriable."""
    from avsim.operators.exceptions import FAILURE_EXCEPTIONS, PhaseRetriable

    cls = FAILURE_EXCEPTIONS[stop.failure]
    if stop.retry_delay is not None:
        assert issubclass(cls, PhaseRetriable), cls
        return cls(stop.message, retry_delay=stop.retry_delay)
    return cls(stop.message)
