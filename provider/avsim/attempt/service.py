"""The phase contract's bookkeeping around one attempt, shared by every backend: no Airflow here.

:class:`AttemptService` takes a phase task's :class:`~avsim.attempt.args.PhaseArgs` and answers
around the launch a backend implements:

:meth:`AttemptService.begin`
    Resolve the phase's spec from the run's manifest snapshot (its inputs come resolved from the
    task). Answer the committed result at once (no launch) when the phase already has one, or when
    the cache holds one for the same key (a rerun with the same pins). Fail fast when the build's
    circuit breaker is open. Record attempts of earlier tries that never reported (a lost worker)
    as infrastructure failures, check the budgets, then claim the next attempt number in the ledger.
:meth:`AttemptService.end`
    Class a result whose declared outputs are missing as ``infra_failed``/``missing_output``; fence on
    ownership (an attempt a newer try took over, or one already ended or committed, records and counts
    nothing); record how the attempt ended, feed the build's breaker, emit metrics, and decide by class
    (:func:`avsim.phases.policy.decide`): commit a result; fail fast on bad input or a bad build; retry
    an infrastructure failure or a preemption after its class's delay while its budget lasts; hand a
    GPU phase preempted too often on spot nodes over to its on-demand twin.
:meth:`AttemptService.commit_passed`
    The same end for a passed attempt, as the committing trigger makes it (no decision to take).

Answers are typed (:mod:`avsim.attempt.steps`); the operators and the trigger
(:mod:`avsim.operators.lifecycle`, :mod:`avsim.operators.pass_commit`) turn them into Airflow's terms.
The module imports nothing of Airflow (``tests/unit/test_attempt_service.py`` checks it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
from collections.abc import Mapping
from typing import Any

from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.attempt.args import TryView
from avsim.attempt.books import AttemptBooks, class_of, published, result_of, utcnow
from avsim.attempt.steps import Begun, Done, Ended, HandOver, Launch, Stop, TaskSide
from avsim.ledger.records import AttemptRecord, OutcomeRecord
from avsim.phases import policy
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.phases.policy import Action, Decision
from avsim.plan.model import ON_DEMAND_SUFFIX

__all__ = ["AttemptService", "ResolvedInputs", "published", "result_of"]


@dataclasses.dataclass(frozen=True)
class ResolvedInputs:
    """The attempt's inputs: upstream phase -> committed output URI, and -> that output's cache key
    (empty for fixed inputs). The task reads them from its upstream phases' results."""

    uris: Mapping[str, str]
    upstream_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)


class AttemptService(AttemptBooks):
    """One phase task's attempts: begin, end, and the committing trigger's end (the books it keeps
    them in: :class:`avsim.attempt.books.AttemptBooks`).

    :param args: the task's phase arguments, rendered.
    :param meter: where metrics go (:mod:`avsim.metrics` in a task or a trigger).
    :param log: the task's logger.
    """

    # -- begin --------------------------------------------------------------------------------------
    def attempt_for(self, inputs: ResolvedInputs, number: int = 0, key: str | None = None) -> PhaseAttempt:
        """The phase's attempt ``number`` (0: not claimed yet), from the run's snapshot and its inputs;
        its cache key is computed, or ``key`` (a resumed deferral's, kept from before it deferred)."""
        from avsim.ledger.cache import cache_key

        case = self.args.case
        spec = self.runtime_spec()
        if key is None:
            key = (
                ""
                if self.args.is_run_level
                else cache_key(
                    image=self.descriptor.image,
                    phase=self.phase,
                    spec=spec,
                    case=case,
                    upstream_keys=dict(inputs.upstream_keys),
                )
            )
        return PhaseAttempt(
            layout=self.layout,
            case=case,
            phase=self.phase,
            attempt=number,
            runtime=PhaseRuntime.from_spec(spec),
            build_id=self.descriptor.build_id,
            image=self.descriptor.image,
            inputs=dict(inputs.uris),
            node_class=self.args.node_class,
            cache_key=key,
        )

    def begin(self, tv: TryView, inputs: ResolvedInputs, task: TaskSide) -> Begun:
        """The claimed attempt to launch (:class:`Launch`), or the phase's end without a launch: its
        committed or cached result (:class:`Done`), or a failure (:class:`Stop`: the breaker is open,
        lost workers used up the budget), recorded and committed."""
        attempt = self.attempt_for(inputs)
        runtime = attempt.runtime
        committed = self.ledger.outcome(attempt.case_id, self.phase)
        if committed is not None and committed.outcome.produced_output and self._still_current(committed, tv):
            self.log.info(
                "%s already has a committed result (attempt %d, %s): reused, nothing launched",
                self.where(),
                committed.attempt,
                committed.outcome.value,
            )
            return Done(result_of(committed))
        template = AttemptRecord(
            run_key=self.layout.run_key,
            case_id=attempt.case_id,
            phase=self.phase,
            attempt=0,
            started_at=utcnow().isoformat(),
            ended_at="",
            exit_code=None,
            outcome=None,
            reason="",
            output_uri="",
            host=socket.gethostname(),
            duration_seconds=0.0,
            state="started",
            try_number=tv.try_number,
            task_id=self.args.task_id,
            round_start=tv.round_start(self.args.retries),
            node_class=self.args.node_class,
            gpus=runtime.gpus,
        )
        if attempt.cache_key and self.args.reuse_outputs and self.phase not in self.args.case.fresh_phases:
            hit = self.cache.lookup(attempt.cache_key)
            if hit is not None:
                return self._commit_reused(template, attempt.cache_key, hit)
        # A run-level phase summarises the run, a stopped week too: the breaker keeps the build's cases
        # from spending compute, not the week's summary of what happened to them.
        state = self.breaker.state() if not self.args.is_run_level else None
        if state is not None and state.is_open:
            return self._fail_without_launch(
                task,
                template,
                Outcome.BAD_BUILD,
                Detail.BREAKER_OPEN,
                f"circuit breaker open for build {self.descriptor.build_id} ({self.breaker.digest}): "
                f"{state.reason}; nothing launched. Reset it with `avsim breaker reset {self.breaker.digest}` "
                "once the build is fixed, or start a run with a new build",
            )
        history = self.settle_abandoned(tv, template.round_start)
        if any(o.produced_output for o in history):
            # An earlier try's attempt ended with a result while this try settled it (its trigger
            # committed in between): that commit is the phase's result, nothing to launch.
            late = self.ledger.outcome(attempt.case_id, self.phase)
            if late is not None and late.outcome.produced_output and self._still_current(late, tv):
                return Done(result_of(late))
        decision = policy.admit(history, runtime.retry, self.args.role, gpus=runtime.gpus)
        if decision.action is Action.EXHAUSTED:
            task.publish(published(template, decision.outcome))
            # Only lost workers' attempts (settled above) can get here: nothing else raised for them.
            result = AttemptResult(
                decision.outcome,
                reason="lost workers used up the infrastructure budget",
                detail=Detail.ABANDONED,
            )
            return self._commit_failure(template, result, decision)
        claimed = self.ledger.claim_attempt(template)
        return Launch(attempt.with_attempt(claimed.attempt))

    def _still_current(self, committed: OutcomeRecord, tv: TryView) -> bool:
        """Whether a committed result is still the phase's result for this try. A case phase's is,
        always (its inputs are pinned). A run-level phase's inputs are every shard's summary, which a
        repair changes: its result stands within the round that committed it (a lost worker's retry),
        and a cleared task (a new round) runs it again."""
        if not self.args.is_run_level:
            return True
        from avsim.storage import read_json

        try:
            ran = AttemptRecord.from_json(
                read_json(self.layout.attempt_record(committed.case_id, committed.phase, committed.attempt))
            )
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return False
        return ran.try_number >= tv.round_start(self.args.retries)

    def settle_abandoned(self, tv: TryView, round_start: int) -> list[Outcome]:
        """Attempts of earlier tries still marked started: their worker was lost. Record them as infra,
        only while their record is still ``started`` (:meth:`Ledger.settle_attempt`): a trigger may
        record the attempt's pass between the list and the write, and that pass stands. Returns the
        outcomes of the task's ended attempts in its current round, each as its record holds it."""
        history: list[Outcome] = []
        for rec in self.ledger.attempts(self.args.case_id, self.phase):
            if rec.state == "started" and rec.try_number < tv.try_number:
                lost = dataclasses.replace(
                    rec,
                    state="ended",
                    ended_at=utcnow().isoformat(),
                    outcome=Outcome.INFRA_FAILED,
                    detail=Detail.ABANDONED,
                    reason=f"no report from try {rec.try_number}: its worker was lost or killed",
                )
                rec = self.ledger.settle_attempt(lost)
                if rec == lost:
                    self.log.warning(
                        "%s never reported (try %d): recorded as lost",
                        self.where(rec.attempt),
                        rec.try_number,
                    )
                else:
                    self.log.info(
                        "%s ended %s (try %d) as it was being recorded as lost: its end stands",
                        self.where(rec.attempt),
                        rec.outcome.value if rec.outcome else "?",
                        rec.try_number,
                    )
            if self._in_round(rec, round_start) and rec.outcome is not None:
                history.append(rec.outcome)
        return history

    def _in_round(self, rec: AttemptRecord, round_start: int) -> bool:
        return rec.task_id == self.args.task_id and rec.try_number >= round_start and rec.ended

    def _round_history(self, round_start: int, *, excluding: int) -> list[Outcome]:
        """The outcomes of the task's ended attempts in its current round, but attempt ``excluding``."""
        return [
            rec.outcome
            for rec in self.ledger.attempts(self.args.case_id, self.phase)
            if self._in_round(rec, round_start) and rec.outcome is not None and rec.attempt != excluding
        ]

    # -- end ----------------------------------------------------------------------------------------
    def end(
        self, tv: TryView, attempt: PhaseAttempt, result: AttemptResult, started: dt.datetime, task: TaskSide
    ) -> Ended:
        """Record and classify the attempt's end, and decide: the phase's result, or how it fails.

        A result whose declared outputs are missing is an infrastructure failure; an attempt that no
        longer owns its phase records nothing (:meth:`record_ended`, which raises
        :class:`~avsim.ledger.store.AttemptSuperseded`)."""
        result, result_doc = self.outputs_checked(result, attempt.output_uri)
        rec = self.ended_record(
            attempt=attempt.attempt,
            output_uri=attempt.output_uri,
            gpus=attempt.runtime.gpus,
            try_number=tv.try_number,
            round_start=tv.round_start(self.args.retries),
            result=result,
            started=started,
        )
        settled = self.record_ended(rec, attempt.runtime.gpus)
        if settled is not None:
            return Done(result_of(settled))
        if not result.outcome.produced_output:  # a committed result is the task's return value
            task.publish(published(rec))
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
            self.args.role,
            detail=result.detail,
            gpus=attempt.runtime.gpus,
            last_try=tv.is_last,
        )
        if decision.action is Action.COMMIT:
            committed = self.commit(rec, result, attempt.cache_key, result_doc)
            if result.outcome is Outcome.SCENARIO_FAILED:
                self.log.warning(
                    "%s: the driving software failed the scenario (recorded as a result)",
                    self.where(attempt.attempt),
                )
            return committed
        if decision.action is Action.HAND_OVER:
            task.ready_twin()
            twin = f"{self.args.task_id}{ON_DEMAND_SUFFIX}"
            return HandOver(
                f"{self.where(attempt.attempt)} was {decision.describe()} ({twin})",
                case=self.args.case.to_json(),
                run=self.descriptor.to_json(),
                twin_task_id=twin,
            )
        if decision.action is Action.RETRY:
            return _retry(self.where(rec.attempt), rec, result, decision)
        return self._commit_failure(rec, result, decision)

    def commit(
        self, rec: AttemptRecord, result: AttemptResult, cache_key: str, result_doc: Any = None
    ) -> Done:
        """Commit an attempt's output (the first commit of a phase wins, :meth:`Ledger.commit`) and
        store it in the cache: the phase's result. ``rec`` passed the fence (:meth:`record_ended`);
        ``result_doc``: its ``result.json`` when read already."""
        out = self._outcome_record(rec, result, output=True, cache_key=cache_key, result_doc=result_doc)
        self.ledger.commit(out, fenced=True)
        final = self.ledger.outcome(rec.case_id, self.phase) or out
        if final.cache_key and final.attempt == rec.attempt and not self.descriptor.triage_of:
            self.cache.store(final.cache_key, final)
        return Done(result_of(final))

    # -- the committing trigger's end, and a deferral that timed out ----------------------------------
    def commit_passed(
        self,
        *,
        attempt: int,
        output_uri: str,
        gpus: int,
        try_number: int,
        round_start: int,
        cache_key: str,
        started: dt.datetime,
        result: AttemptResult,
    ) -> Done | AttemptResult:
        """Check a passed attempt's outputs, fence, record, measure and commit it (the order
        :meth:`end` keeps): the phase's result. When its outputs are missing, the checked result
        (``infra_failed``/``missing_output``): that end is a failure with a retry decision, which is
        the worker's (nothing is recorded). Raises
        :class:`~avsim.ledger.store.AttemptSuperseded` when a newer try owns the phase."""
        if result.outcome is not Outcome.PASSED:
            raise ValueError(
                f"{self.args.task_id}: the trigger commits passed attempts only, not {result.outcome.value}"
            )
        checked, result_doc = self.outputs_checked(result, output_uri)
        if checked.outcome is not Outcome.PASSED:
            return checked
        rec = self.ended_record(
            attempt=attempt,
            output_uri=output_uri,
            gpus=gpus,
            try_number=try_number,
            round_start=round_start,
            result=result,
            started=started,
        )
        settled = self.record_ended(rec, gpus)
        if settled is not None:
            return Done(result_of(settled))
        return self.commit(rec, result, cache_key, result_doc)

    def committed_pass(self, attempt: int) -> Done | None:
        """The phase's result when attempt ``attempt`` committed a pass, else None."""
        found = self.ledger.outcome(self.args.case_id, self.phase)
        if found is None or found.attempt != attempt or found.outcome is not Outcome.PASSED:
            return None
        return Done(result_of(found))

    def committed_after_timeout(self) -> tuple[Done | None, int]:
        """After Airflow timed a deferral out: the phase's committed result, if one stands (a run-level
        phase's only from its current attempt), and the current attempt's number."""
        committed = self.ledger.outcome(self.args.case_id, self.phase)
        number = self.ledger.current_attempt(self.args.case_id, self.phase) or 0
        if (
            committed is not None
            and committed.outcome.produced_output
            and (committed.attempt == number or not self.args.is_run_level)
        ):
            return Done(result_of(committed)), number
        return None, number

    def attempt_of_try(self, try_number: int, task_id: str) -> int | None:
        """The attempt try ``try_number`` of task ``task_id`` claimed last (None: it claimed none)."""
        mine = [
            r.attempt
            for r in self.ledger.attempts(self.args.case_id, self.phase)
            if r.try_number == try_number and (not r.task_id or r.task_id == task_id)
        ]
        return max(mine, default=None)

    def started_at(self, attempt: int) -> dt.datetime:
        """When attempt ``attempt`` was claimed (now, when its record is not found)."""
        records = [r for r in self.ledger.attempts(self.args.case_id, self.phase) if r.attempt == attempt]
        if records and records[-1].started_at:
            return dt.datetime.fromisoformat(records[-1].started_at)
        return utcnow()


def _retry(where: str, rec: AttemptRecord, result: AttemptResult, decision: Decision) -> Stop:
    assert decision.failure is not None
    runner = f" [{rec.runner}]" if rec.runner else ""
    return Stop(
        decision.failure,
        f"{where} {class_of(result)}{runner}: {result.reason or 'no reason given'} ({decision.describe()})",
        retry_delay=dt.timedelta(seconds=decision.delay_seconds),
    )
