"""The phase contract's bookkeeping around one attempt, shared by every backend.

A phase operator (:class:`avsim.operators.phase.LocalPhaseOperator`, the Kubernetes pod operator)
mixes in :class:`PhaseLifecycle` and calls two methods around the launch it implements:

:meth:`PhaseLifecycle.begin_attempt`
    Resolve the phase's spec from the run's manifest snapshot and its inputs from the upstream
    phases' committed outputs. Return the committed result at once (no launch) when the phase
    already has one, or when the cache holds one for the same key (a rerun with the same pins).
    Fail fast when the build's circuit breaker is open. Record attempts of earlier tries that
    never reported (a lost worker) as infrastructure failures, check the budgets, then claim the
    next attempt number in the ledger.
:meth:`PhaseLifecycle.end_attempt`
    Class a result whose declared outputs are missing as ``infra_failed``/``missing_output``; fence on
    ownership (an attempt a newer try took over, or one already ended or committed, records and counts
    nothing); record how the attempt ended, feed the build's breaker, emit metrics, and decide by class:
    commit a result and return it; fail fast on bad input or a bad build; retry an
    infrastructure failure or a preemption after its class's delay while its budget lasts;
    hand a GPU phase preempted too often on spot nodes over to its on-demand twin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from avsim import airflow_internals
from avsim.artifacts import RUN_LEVEL_CASE, RunLayout
from avsim.attempt import PhaseAttempt, PhaseRuntime, phase_spec_for
from avsim.contracts import OUTCOME_XCOM_KEY, PhaseResult, RunDescriptor, run_document
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.phases import policy
from avsim.phases.contract import NODE_CPU, NODE_ON_DEMAND, NODE_SPOT, AttemptResult, Outcome
from avsim.phases.policy import Action, Decision, Role
from avsim.plan.model import ON_DEMAND_SUFFIX

__all__ = ["HANDOVER_XCOM", "NODE_CPU", "NODE_ON_DEMAND", "NODE_SPOT", "AttemptResult", "PhaseLifecycle"]

#: The XCom a spot task leaves its on-demand twin when it hands a GPU phase over.
HANDOVER_XCOM = "avsim_handover"
#: States an earlier round can leave an on-demand twin in, from which it would never run again.
TWIN_LEFT_BEHIND = frozenset({"skipped", "failed", "upstream_failed", "success", "removed"})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def upstream_task_ids(upstream: Mapping[str, str | Sequence[str]] | None) -> dict[str, list[str]]:
    """Normalise ``upstream phase -> task id(s)``: one task, or a GPU phase's spot task and on-demand twin."""
    return {k: [v] if isinstance(v, str) else list(v) for k, v in (upstream or {}).items()}


class PhaseLifecycle:
    """Mixin for phase operators. Their constructors call :meth:`init_phase` with the phase
    arguments both backends share; everything the lifecycle reads is set there."""

    phase: str
    case: Any
    run: Any
    upstream_phases: dict[str, list[str]]
    inputs: Any
    role: Role
    node_class: str
    task_id: str
    retries: int | None
    log: Any

    reuse_outputs: bool

    def init_phase(
        self,
        *,
        phase: str,
        case: Any,
        run: Any,
        upstream_phases: Mapping[str, str | Sequence[str]] | None,
        inputs: Any,
        role: Role | str,
        gpus: int,
        reuse_outputs: bool,
    ) -> None:
        """The phase arguments of every phase operator (see :class:`avsim.operators.phase.AvsimPhaseOperator`)."""
        self.phase = phase
        self.case = case
        self.run = run
        self.upstream_phases = upstream_task_ids(upstream_phases)
        self.inputs = inputs
        self.role = Role(role)
        self.gpus = gpus
        self.node_class = self.node_class_for(gpus, self.role)
        self.reuse_outputs = reuse_outputs

    # -- where things are ---------------------------------------------------------------------------
    @cached_property
    def descriptor(self) -> RunDescriptor:
        """The run this phase belongs to (``run``, as ``prepare`` described it)."""
        doc = run_document(self.run)
        if doc is None:
            from avsim.errors import AvsimError

            raise AvsimError(
                f"{self.task_id}: no run descriptor (run={str(self.run)[:120]!r}); a shard run's conf carries "
                "it, and shard runs are started by the weekly run"
            )
        return RunDescriptor.model_validate(doc)

    @cached_property
    def layout(self) -> RunLayout:
        return self.descriptor.layout

    @cached_property
    def ledger(self) -> Any:
        from avsim.ledger.store import Ledger

        return Ledger(self.layout)

    @cached_property
    def head(self) -> dict[str, Any]:
        from avsim.storage import read_json

        return dict(read_json(self.layout.head_uri))

    @cached_property
    def breaker(self) -> Any:
        from avsim.ledger.breaker import Breaker, BreakerConfig, image_digest

        return Breaker(
            self.layout.root,
            image_digest(self.descriptor.image),
            build_id=self.descriptor.build_id,
            config=BreakerConfig.from_head(self.head),
            documents=self.ledger.documents,
        )

    @cached_property
    def cache(self) -> Any:
        from avsim.ledger.cache import PhaseCache

        return PhaseCache(self.layout.root, self.ledger.documents)

    @property
    def is_run_level(self) -> bool:
        return dict(self.case).get("case_id") == RUN_LEVEL_CASE

    def _where(self, attempt: int | None = None) -> str:
        case_id = dict(self.case).get("case_id")
        tail = f" (attempt {attempt})" if attempt else ""
        return f"phase {self.phase!r} of case {case_id!r}{tail}"

    # -- inputs -------------------------------------------------------------------------------------
    def resolve_inputs(self, context: Any) -> tuple[dict[str, str], dict[str, str]]:
        """Upstream phase -> committed output URI, and -> its cache key."""
        if self.inputs:
            return dict(self.inputs), {}
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
        return uris, keys

    def runtime_spec(self) -> dict[str, Any]:
        if self.is_run_level:
            return dict(self.head["run_phases"][self.phase])
        return phase_spec_for(self.head, dict(self.case), self.phase)

    # -- begin --------------------------------------------------------------------------------------
    def attempt_for(
        self, context: Any, number: int = 0, resolved: tuple[Mapping[str, str], str] | None = None
    ) -> tuple[PhaseAttempt, str]:
        """The phase's attempt ``number`` (0: not claimed yet) and its cache key, from the run's
        snapshot and the upstream phases' committed outputs. A deferred operator that resumes rebuilds
        its attempt with this, from the inputs and cache key it ``resolved`` before it deferred (no
        upstream XCom read again)."""
        from avsim.ledger.cache import cache_key

        case = dict(self.case)
        spec = self.runtime_spec()
        if resolved is not None:
            uris, key = dict(resolved[0]), resolved[1]
        else:
            uris, upstream_keys = self.resolve_inputs(context)
            key = (
                ""
                if self.is_run_level
                else cache_key(
                    image=self.descriptor.image,
                    phase=self.phase,
                    spec=spec,
                    case=case,
                    upstream_keys=upstream_keys,
                )
            )
        attempt = PhaseAttempt(
            layout=self.layout,
            case=case,
            phase=self.phase,
            attempt=number,
            runtime=PhaseRuntime.from_spec(spec),
            build_id=self.descriptor.build_id,
            image=self.descriptor.image,
            inputs=uris,
            node_class=self.node_class,
            cache_key=key,
        )
        return attempt, key

    def begin_attempt(self, context: Any) -> PhaseAttempt | dict[str, Any]:
        """The claimed attempt to launch, or the phase's committed result (a dict) when there is nothing
        to launch. Raises when the phase must fail without launching."""
        ti = context["ti"]
        attempt, key = self.attempt_for(context)
        runtime = attempt.runtime
        committed = self.ledger.outcome(attempt.case_id, self.phase)
        if committed is not None and committed.outcome.produced_output and self._still_current(committed, ti):
            self.log.info(
                "%s already has a committed result (attempt %d, %s): reused, nothing launched",
                self._where(),
                committed.attempt,
                committed.outcome.value,
            )
            return self._xcom(committed)
        template = AttemptRecord(
            run_key=self.layout.run_key,
            case_id=attempt.case_id,
            phase=self.phase,
            attempt=0,
            started_at=_now().isoformat(),
            ended_at="",
            exit_code=None,
            outcome=None,
            reason="",
            output_uri="",
            host=socket.gethostname(),
            duration_seconds=0.0,
            state="started",
            try_number=int(ti.try_number),
            task_id=self.task_id,
            round_start=self.round_start(ti),
            node_class=self.node_class,
            gpus=runtime.gpus,
        )
        if key and self.reuse_outputs:
            hit = self.cache.lookup(key)
            if hit is not None:
                return self._commit_reused(template, key, hit)
        # A run-level phase summarises the run, a stopped week too: the breaker keeps the build's cases
        # from spending compute, not the week's summary of what happened to them.
        state = self.breaker.state() if not self.is_run_level else None
        if state is not None and state.is_open:
            return self._fail_without_launch(
                ti,
                template,
                Outcome.BAD_BUILD,
                "breaker_open",
                f"circuit breaker open for build {self.descriptor.build_id} ({self.breaker.digest}): "
                f"{state.reason}; nothing launched. Reset it with `avsim breaker reset {self.breaker.digest}` "
                "once the build is fixed, or start a run with a new build",
            )
        history = self._settle_abandoned(ti, template.round_start)
        if any(o.produced_output for o in history):
            # An earlier try's attempt ended with a result while this try settled it (its trigger
            # committed in between): that commit is the phase's result, nothing to launch.
            late = self.ledger.outcome(attempt.case_id, self.phase)
            if late is not None and late.outcome.produced_output and self._still_current(late, ti):
                return self._xcom(late)
        self._admit(ti, template, runtime, history)
        claimed = self.ledger.claim_attempt(template)
        return attempt.with_attempt(claimed.attempt)

    def _still_current(self, committed: OutcomeRecord, ti: Any) -> bool:
        """Whether a committed result is still the phase's result for this try. A case phase's is,
        always (its inputs are pinned). A run-level phase's inputs are every shard's summary, which a
        repair changes: its result stands within the round that committed it (a lost worker's retry),
        and a cleared task (a new round) runs it again."""
        if not self.is_run_level:
            return True
        from avsim.storage import read_json

        try:
            ran = AttemptRecord.from_json(
                read_json(self.layout.attempt_record(committed.case_id, committed.phase, committed.attempt))
            )
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return False
        return ran.try_number >= self.round_start(ti)

    def round_start(self, ti: Any) -> int:
        """The first try of the task's current round (a clear starts a new round with fresh budgets)."""
        max_tries = int(getattr(ti, "max_tries", 0) or 0)
        retries = int(self.retries or 0)
        return max(1, max_tries - retries + 1)

    def _settle_abandoned(self, ti: Any, round_start: int) -> list[Outcome]:
        """Attempts of earlier tries still marked started: their worker was lost. Record them as infra,
        only while their record is still ``started`` (:meth:`Ledger.settle_attempt`): a trigger may
        record the attempt's pass between the list and the write, and that pass stands. Returns the
        outcomes of the task's ended attempts in its current round, each as its record holds it."""
        history: list[Outcome] = []
        for rec in self.ledger.attempts(dict(self.case)["case_id"], self.phase):
            if rec.state == "started" and rec.try_number < int(ti.try_number):
                lost = dataclasses.replace(
                    rec,
                    state="ended",
                    ended_at=_now().isoformat(),
                    outcome=Outcome.INFRA_FAILED,
                    detail="abandoned",
                    reason=f"no report from try {rec.try_number}: its worker was lost or killed",
                )
                rec = self.ledger.settle_attempt(lost)
                if rec == lost:
                    self.log.warning(
                        "%s never reported (try %d): recorded as lost",
                        self._where(rec.attempt),
                        rec.try_number,
                    )
                else:
                    self.log.info(
                        "%s ended %s (try %d) as it was being recorded as lost: its end stands",
                        self._where(rec.attempt),
                        rec.outcome.value if rec.outcome else "?",
                        rec.try_number,
                    )
            if self._in_round(rec, round_start) and rec.outcome is not None:
                history.append(rec.outcome)
        return history

    def _in_round(self, rec: AttemptRecord, round_start: int) -> bool:
        return rec.task_id == self.task_id and rec.try_number >= round_start and rec.ended

    def _round_history(self, round_start: int, *, excluding: int) -> list[Outcome]:
        """The outcomes of the task's ended attempts in its current round, but attempt ``excluding``."""
        return [
            rec.outcome
            for rec in self.ledger.attempts(dict(self.case)["case_id"], self.phase)
            if self._in_round(rec, round_start) and rec.outcome is not None and rec.attempt != excluding
        ]

    def _admit(self, ti: Any, template: AttemptRecord, runtime: PhaseRuntime, history: list[Outcome]) -> None:
        decision = policy.admit(history, runtime.retry, self.role, gpus=runtime.gpus)
        if decision.action is Action.EXHAUSTED:
            self._publish(ti, template, decision.outcome)
            # Only lost workers' attempts (settled above) can get here: nothing else raised for them.
            result = AttemptResult(
                decision.outcome, reason="lost workers used up the infrastructure budget", detail="abandoned"
            )
            self._commit_failure_and_raise(template, result, decision)

    # -- end ----------------------------------------------------------------------------------------
    def end_attempt(
        self, context: Any, attempt: PhaseAttempt, result: AttemptResult, started: dt.datetime
    ) -> dict[str, Any]:
        """Record and classify the attempt's end: return the phase's result or raise by class.

        A result whose declared outputs are missing is an infrastructure failure; an attempt that no
        longer owns its phase records nothing (:meth:`_record_ended`)."""
        ti = context["ti"]
        result, result_doc = self._outputs_checked(result, attempt.output_uri)
        rec = self._ended_record(
            case_id=attempt.case_id,
            attempt=attempt.attempt,
            output_uri=attempt.output_uri,
            gpus=attempt.runtime.gpus,
            try_number=int(ti.try_number),
            round_start=self.round_start(ti),
            result=result,
            started=started,
        )
        settled = self._record_ended(rec, attempt.runtime.gpus)
        if settled is not None:
            return self._xcom(settled)
        if not result.outcome.produced_output:  # a committed result is the task's return value
            self._publish(ti, rec)
        # A result is committed whatever came before it: only a failure's decision reads the round.
        history = (
            []
            if result.outcome.produced_output
            else self._round_history(rec.round_start, excluding=rec.attempt)
        )
        decision = policy.decide(
            history,
            result.outcome,
            attempt.runtime.retry,
            self.role,
            detail=result.detail,
            gpus=attempt.runtime.gpus,
            last_try=int(ti.try_number) > int(getattr(ti, "max_tries", self.retries or 0) or 0),
        )
        if decision.action is Action.COMMIT:
            committed = self._commit(rec, result, attempt.cache_key, result_doc)
            if result.outcome is Outcome.SCENARIO_FAILED:
                self.log.warning(
                    "%s: the driving software failed the scenario (recorded as a result)",
                    self._where(attempt.attempt),
                )
            return committed
        if decision.action is Action.HAND_OVER:
            from avsim.operators.exceptions import PhaseFallbackToOnDemand

            self._ready_the_twin(ti)
            context["ti"].xcom_push(
                key=HANDOVER_XCOM, value={"case": dict(self.case), "run": self.descriptor.to_json()}
            )
            raise PhaseFallbackToOnDemand(
                f"{self._where(attempt.attempt)} was {decision.describe()} ({self.task_id}{ON_DEMAND_SUFFIX})"
            )
        if decision.action is Action.RETRY:
            self._raise_retriable(rec, result, decision)
        self._commit_failure_and_raise(rec, result, decision)
        raise AssertionError("unreachable")

    def _ended_record(
        self,
        *,
        case_id: str,
        attempt: int,
        output_uri: str,
        gpus: int,
        try_number: int,
        round_start: int,
        result: AttemptResult,
        started: dt.datetime,
    ) -> AttemptRecord:
        """The ledger's record of an attempt that ended with ``result``: what the worker that resumes
        the phase and the trigger that ends a passed one (:mod:`avsim.operators.pass_commit`) write."""
        ended = _now()
        return AttemptRecord(
            run_key=self.layout.run_key,
            case_id=case_id,
            phase=self.phase,
            attempt=attempt,
            started_at=started.isoformat(),
            ended_at=ended.isoformat(),
            exit_code=result.exit_code,
            outcome=result.outcome,
            reason=result.reason[-500:],
            output_uri=output_uri,
            host=socket.gethostname(),
            duration_seconds=(ended - started).total_seconds(),
            state="ended",
            try_number=try_number,
            task_id=self.task_id,
            round_start=round_start,
            node_class=self.node_class,
            gpus=gpus,
            detail=result.detail,
            runner=result.runner,
        )

    def _record_ended(self, rec: AttemptRecord, gpus: int) -> OutcomeRecord | None:
        """Fence, then write an ended attempt's record, emit its metrics and feed the build's breaker
        (a case's first attempt): the worker's and the committing trigger's one way to end an attempt.

        The fence (:meth:`avsim.ledger.store.Ledger.end_attempt`) comes first, so a stale or duplicate
        report counts nothing: returns the phase's committed result when the attempt's end is settled
        already (this attempt committed, or a newer one did), None when the caller goes on to decide
        and commit. Raises :class:`avsim.ledger.store.AttemptSuperseded` when a newer try owns the
        phase and nothing is committed."""
        from avsim.ledger.records import Standing
        from avsim.ledger.store import AttemptSuperseded

        standing, committed = self.ledger.end_attempt(rec)
        if standing is Standing.COMMITTED or (
            standing is Standing.SUPERSEDED and committed is not None and committed.outcome.produced_output
        ):
            assert committed is not None
            self.log.warning(
                "%s ended %s, but attempt %d's result is committed: returned, nothing recorded",
                self._where(rec.attempt),
                rec.outcome.value if rec.outcome else "?",
                committed.attempt,
            )
            return committed
        if standing is Standing.SUPERSEDED:
            current = self.ledger.current_attempt(rec.case_id, rec.phase)
            raise AttemptSuperseded(
                f"{self._where(rec.attempt)} ended {rec.outcome.value if rec.outcome else '?'} after a newer "
                f"try took the phase over (attempt {current} is the current one): not recorded, counted "
                "or committed"
            )
        if standing is Standing.OWNED:
            self._measure(rec, gpus)
        return None

    def _measure(self, rec: AttemptRecord, gpus: int) -> None:
        """An ended attempt's metrics, and a case's first attempt in the build's breaker window."""
        from avsim import metrics

        assert rec.outcome is not None
        res_class = "gpu" if gpus else "cpu"
        metrics.phase_outcome(self.phase, rec.outcome.value, res_class, self.node_class)
        if gpus:
            metrics.gpu_seconds(self.phase, rec.duration_seconds * gpus, self.node_class)
        if rec.outcome is Outcome.PREEMPTED:
            metrics.preemption(self.phase, self.node_class)
        first = rec.attempt == 1 and rec.outcome is not Outcome.PREEMPTED and not self.is_run_level
        if first and self.breaker.record(rec.outcome.counts_against_build, self._where(rec.attempt)):
            metrics.breaker_trip(self.descriptor.build_id, self.breaker.digest)

    def _outputs_checked(self, result: AttemptResult, output_uri: str) -> tuple[AttemptResult, Any]:
        """``result`` checked against the outputs the attempt declares (the phase contract's
        :func:`~avsim.phases.contract.classify_outputs`), and its ``result.json`` (None when unread):
        a result whose declared outputs are missing is ``infra_failed``/``missing_output``."""
        if not result.outcome.produced_output:
            return result, None
        from avsim import storage
        from avsim.phases import contract

        try:
            doc = storage.read_json(f"{output_uri}/{contract.RESULT_FILE}")
        except (FileNotFoundError, OSError, ValueError):
            doc = None
        missing = [
            name
            for name in contract.declared_outputs(doc)
            if (doc is None if name == contract.RESULT_FILE else not storage.exists(f"{output_uri}/{name}"))
        ]
        checked = contract.classify_outputs(result, missing)
        if checked is not result:
            self.log.error("%s: %s", self._where(), checked.reason)
        return checked, doc

    def _outcome_record(
        self,
        rec: AttemptRecord,
        result: AttemptResult,
        *,
        output: bool,
        cache_key: str = "",
        result_doc: Any = None,
    ) -> OutcomeRecord:
        return OutcomeRecord(
            run_key=self.layout.run_key,
            case_id=rec.case_id,
            phase=self.phase,
            attempt=rec.attempt,
            outcome=result.outcome,
            output_uri=rec.output_uri if output else "",
            committed_at=_now().isoformat(),
            reason=result.reason[-500:],
            result=self._small_result(rec.output_uri, result_doc) if output else {},
            cache_key=cache_key if output else "",
            detail=result.detail,
        )

    def _commit(
        self, rec: AttemptRecord, result: AttemptResult, cache_key: str, result_doc: Any = None
    ) -> dict[str, Any]:
        """Commit an attempt's output (the first commit of a phase wins) and return the phase's result.
        ``result_doc``: the attempt's ``result.json`` when it was read already."""
        out = self._outcome_record(rec, result, output=True, cache_key=cache_key, result_doc=result_doc)
        self.ledger.commit(out)
        final = self.ledger.outcome(rec.case_id, self.phase) or out
        if final.cache_key and final.attempt == rec.attempt:
            self.cache.store(final.cache_key, final)
        return self._xcom(final)

    def _commit_failure_and_raise(
        self, rec: AttemptRecord, result: AttemptResult, decision: Decision
    ) -> None:
        from avsim.operators.exceptions import FAILURE_EXCEPTIONS

        self.ledger.commit(self._outcome_record(rec, result, output=False))
        where = self._where(rec.attempt or None)
        what = f"{result.reason or result.outcome.value}" + (f" [{rec.runner}]" if rec.runner else "")
        assert decision.failure is not None
        cls = FAILURE_EXCEPTIONS[decision.failure]
        if decision.action is Action.FAIL_FAST:
            if result.outcome is Outcome.BAD_BUILD:
                raise cls(f"{where}: bad build {self.descriptor.build_id}: {what}")
            raise cls(f"{where} rejected its input: {what}")
        klass = result.outcome.value + (f"/{result.detail}" if result.detail else "")
        raise cls(f"{where} failed ({klass}): {what}; {decision.describe()}")

    def _raise_retriable(self, rec: AttemptRecord, result: AttemptResult, decision: Decision) -> None:
        from avsim.operators.exceptions import FAILURE_EXCEPTIONS, PhaseRetriable

        assert decision.failure is not None
        cls = FAILURE_EXCEPTIONS[decision.failure]
        assert issubclass(cls, PhaseRetriable), cls
        klass = result.outcome.value + (f"/{result.detail}" if result.detail else "")
        runner = f" [{rec.runner}]" if rec.runner else ""
        raise cls(
            f"{self._where(rec.attempt)} {klass}{runner}: {result.reason or 'no reason given'} "
            f"({decision.describe()})",
            retry_delay=dt.timedelta(seconds=decision.delay_seconds),
        )

    def _fail_without_launch(
        self, ti: Any, template: AttemptRecord, outcome: Outcome, detail: str, reason: str
    ) -> dict[str, Any]:
        claimed = self.ledger.claim_attempt(template)
        ended = dataclasses.replace(
            claimed, state="ended", ended_at=_now().isoformat(), outcome=outcome, detail=detail, reason=reason
        )
        self.ledger.record_attempt(ended)
        self._publish(ti, ended)
        result = AttemptResult(outcome, reason=reason, detail=detail)
        self._commit_failure_and_raise(
            ended, result, Decision(Action.FAIL_FAST, outcome, policy.failure_for(outcome, detail))
        )
        raise AssertionError("unreachable")

    def _commit_reused(self, template: AttemptRecord, key: str, hit: Mapping[str, Any]) -> dict[str, Any]:
        claimed = self.ledger.claim_attempt(template)
        now = _now().isoformat()
        outcome = Outcome(str(hit["outcome"]))
        self.ledger.record_attempt(
            dataclasses.replace(
                claimed,
                state="ended",
                ended_at=now,
                outcome=outcome,
                output_uri=str(hit["output_uri"]),
                detail="reused",
                reason=f"reused the committed output of run {hit.get('run_key')} (cache key {key[:12]})",
            )
        )
        rec = OutcomeRecord(
            run_key=self.layout.run_key,
            case_id=claimed.case_id,
            phase=self.phase,
            attempt=claimed.attempt,
            outcome=outcome,
            output_uri=str(hit["output_uri"]),
            committed_at=now,
            result=dict(hit.get("result") or {}),
            cache_key=key,
            reused_from=f"{hit.get('run_key')}:{hit.get('case_id')}/{hit.get('phase')}#{hit.get('attempt')}",
            detail="reused",
        )
        self.ledger.commit(rec)
        self.log.info(
            "%s: reused the committed output %s (cache key %s): nothing launched",
            self._where(),
            rec.output_uri,
            key[:12],
        )
        return self._xcom(self.ledger.outcome(claimed.case_id, self.phase) or rec)

    def _ready_the_twin(self, ti: Any) -> None:
        """Make sure the on-demand twin runs once this spot task ends skipped.

        The twin runs when its only upstream, this task, was skipped (``all_skipped``). When this task
        failed in an earlier round (its budget, a bad build), Airflow skipped the twin; a repair clears
        failed task instances only, so that twin stays skipped, never runs after a hand-over in the
        repair's round, and the case's next phase finds no output. Such a twin is cleared here, through
        the REST API (``[avsim] airflow_api_conn_id``), before the hand-over. A twin not yet decided
        (the first round) needs nothing, and is read with one execution-API call.
        """
        from avsim import airflow_internals

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

    def take_over(self, context: Any) -> None:
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
        for derived in ("descriptor", "layout", "ledger", "head", "breaker", "cache"):
            self.__dict__.pop(derived, None)

    # -- helpers ------------------------------------------------------------------------------------
    def _xcom(self, rec: OutcomeRecord) -> dict[str, Any]:
        """The task's return value: the committed result downstream phases read."""
        return PhaseResult(
            case_id=rec.case_id,
            phase=rec.phase,
            outcome=rec.outcome,
            output_uri=rec.output_uri,
            attempt=rec.attempt,
            cache_key=rec.cache_key,
            reused=bool(rec.reused_from),
            detail=rec.detail,
        ).to_json()

    def _publish(self, ti: Any, rec: AttemptRecord, outcome: Outcome | None = None) -> None:
        """Push how an attempt that committed no result ended (XCom ``avsim_outcome``), for the pages:
        a failed or retried task's class without a ledger read."""
        outcome = outcome or rec.outcome
        assert outcome is not None
        result = PhaseResult(
            case_id=rec.case_id,
            phase=self.phase,
            outcome=outcome,
            attempt=rec.attempt,
            detail=rec.detail,
            reason=rec.reason[-300:],
        )
        ti.xcom_push(key=OUTCOME_XCOM_KEY, value=result.to_json())

    def _small_result(self, output_uri: str, data: Any = None) -> dict[str, Any]:
        from avsim.storage import read_json

        try:
            data = data if data is not None else read_json(f"{output_uri}/result.json")
        except (FileNotFoundError, OSError, ValueError):
            return {}
        metrics = data.get("metrics", {}) if isinstance(data, dict) else {}
        return {"metrics": metrics} if isinstance(metrics, dict) else {}

    @staticmethod
    def node_class_for(gpus: int, role: Role) -> str:
        return policy.node_class_for(gpus, role)
