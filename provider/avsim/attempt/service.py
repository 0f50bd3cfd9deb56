"""The phase contract around one attempt, shared by every backend: every decision, no Airflow.

:class:`AttemptService` takes a phase task's :class:`~avsim.attempt.args.PhaseArgs` and holds its
books (:class:`avsim.attempt.books.AttemptBooks`, which write what it decides). :meth:`~AttemptService.begin`
answers the committed or cached result, a failure without a launch (an open breaker, a budget lost
workers used up), or the claimed attempt to launch; :meth:`~AttemptService.end` checks an ended
attempt's outputs, fences, records, measures and decides by class (:func:`avsim.phases.policy.decide`)
for the worker and for the committing trigger alike. Answers are typed (:mod:`avsim.attempt.steps`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from avsim.attempt import PhaseAttempt, PhaseRuntime
from avsim.attempt.args import PhaseArgs, ResolvedInputs, TryView
from avsim.attempt.books import AttemptBooks, class_of, published, result_of, utcnow
from avsim.attempt.steps import Begun, Done, Ended, HandOver, Launch, Meter, MissingOutputs, Stop, TaskSide
from avsim.contracts.case import CacheEntry
from avsim.ledger.records import AttemptRecord, OutcomeRecord, Standing
from avsim.ledger.store import AttemptSuperseded
from avsim.phases import contract, policy
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.phases.policy import Action, Decision
from avsim.plan.model import ON_DEMAND_SUFFIX

__all__ = ["AttemptService", "MissingOutputs", "ResolvedInputs", "published", "result_of"]


class AttemptService:
    """One phase task's attempts: begin and end, kept in its :attr:`books`.

    :param args: the task's phase arguments, rendered.
    :param meter: where metrics go (:mod:`avsim.metrics` in a task or a trigger).
    :param log: the task's logger.
    """

    def __init__(self, args: PhaseArgs, *, meter: Meter, log: logging.Logger | Any = None) -> None:
        self.args = args
        self.meter = meter
        self.log = log or logging.getLogger(__name__)
        self.books = AttemptBooks(args, log=self.log)

    @property
    def phase(self) -> str:
        return self.args.phase

    def where(self, attempt: int | None = None) -> str:
        return self.args.where(attempt)

    # -- begin --------------------------------------------------------------------------------------
    def attempt_for(self, inputs: ResolvedInputs, number: int = 0, key: str | None = None) -> PhaseAttempt:
        """The phase's attempt ``number`` (0: not claimed yet), from the run's snapshot and its inputs;
        its cache key is computed, or ``key`` (a resumed deferral's, kept from before it deferred)."""
        from avsim.ledger.cache import cache_key

        books, case = self.books, self.args.case
        spec = books.runtime_spec()
        if key is None:
            key = (
                ""
                if self.args.is_run_level
                else cache_key(
                    image=books.descriptor.image,
                    phase=self.phase,
                    spec=spec,
                    case=case,
                    upstream_keys=dict(inputs.upstream_keys),
                )
            )
        return PhaseAttempt(
            layout=books.layout,
            case=case,
            phase=self.phase,
            attempt=number,
            runtime=PhaseRuntime.from_spec(spec),
            build_id=books.descriptor.build_id,
            image=books.descriptor.image,
            inputs=dict(inputs.uris),
            node_class=self.args.node_class,
            cache_key=key,
        )

    def begin(self, tv: TryView, inputs: ResolvedInputs, task: TaskSide) -> Begun:
        """The claimed attempt to launch (:class:`Launch`), or the phase's end without a launch: its
        committed or cached result (:class:`Done`), or a failure (:class:`Stop`: the breaker is open,
        lost workers used up the budget), recorded and committed."""
        books = self.books
        attempt = self.attempt_for(inputs)
        runtime = attempt.runtime
        committed = books.committed()
        if committed is not None and committed.outcome.produced_output and self._still_current(committed, tv):
            self.log.info(
                "%s already has a committed result (attempt %d, %s): reused, nothing launched",
                self.where(),
                committed.attempt,
                committed.outcome.value,
            )
            return Done(result_of(committed))
        template = books.started_record(tv.try_number, tv.round_start(self.args.retries), runtime.gpus)
        if attempt.cache_key and self.args.reuse_outputs and self.phase not in self.args.case.fresh_phases:
            hit = books.cache.lookup(attempt.cache_key)
            if hit is not None:
                return self._reuse(template, attempt.cache_key, hit)
        # A run-level phase summarises the run, a stopped week too: the breaker keeps the build's cases
        # from spending compute, not the week's summary of what happened to them.
        state = books.breaker.state() if not self.args.is_run_level else None
        if state is not None and state.is_open:
            digest = books.breaker.digest
            return self._fail_without_launch(
                task,
                template,
                Outcome.BAD_BUILD,
                Detail.BREAKER_OPEN,
                f"circuit breaker open for build {books.descriptor.build_id} ({digest}): "
                f"{state.reason}; nothing launched. Reset it with `avsim breaker reset {digest}` "
                "once the build is fixed, or start a run with a new build",
            )
        history = self.settle_abandoned(tv, template.round_start)
        if any(o.produced_output for o in history):
            # An earlier try's attempt ended with a result while this try settled it (its trigger
            # committed in between): that commit is the phase's result, nothing to launch.
            late = books.committed()
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
        claimed = books.claim(template)
        return Launch(attempt.with_attempt(claimed.attempt))

    def _still_current(self, committed: OutcomeRecord, tv: TryView) -> bool:
        """Whether a committed result is still the phase's result for this try. A case phase's is,
        always (its inputs are pinned). A run-level phase's inputs are every shard's summary, which a
        repair changes: its result stands within the round that committed it (a lost worker's retry),
        and a cleared task (a new round) runs it again."""
        if not self.args.is_run_level:
            return True
        ran = self.books.attempt_record(committed.attempt)
        return ran is not None and ran.try_number >= tv.round_start(self.args.retries)

    def settle_abandoned(self, tv: TryView, round_start: int) -> list[Outcome]:
        """Attempts of earlier tries still marked started: their worker was lost. Record them as infra,
        only while their record is still ``started`` (:meth:`AttemptBooks.settle`): a trigger may
        record the attempt's pass between the list and the write, and that pass stands. Returns the
        outcomes of the task's ended attempts in its current round, each as its record holds it."""
        history: list[Outcome] = []
        for rec in self.books.attempts():
            if rec.state == "started" and rec.try_number < tv.try_number:
                lost = dataclasses.replace(
                    rec,
                    state="ended",
                    ended_at=utcnow().isoformat(),
                    outcome=Outcome.INFRA_FAILED,
                    detail=Detail.ABANDONED,
                    reason=f"no report from try {rec.try_number}: its worker was lost or killed",
                )
                rec = self.books.settle(lost)
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
            for rec in self.books.attempts()
            if self._in_round(rec, round_start) and rec.outcome is not None and rec.attempt != excluding
        ]

    # -- end ----------------------------------------------------------------------------------------
    def end(
        self,
        tv: TryView,
        attempt: PhaseAttempt,
        result: AttemptResult,
        started: dt.datetime,
        task: TaskSide,
        *,
        passes_only: bool = False,
    ) -> Ended:
        """Record and classify the attempt's end, and decide: the phase's result, or how it fails.

        A result whose declared outputs are missing is an infrastructure failure (with
        ``passes_only``, the committing trigger's end, it raises :class:`MissingOutputs` and records
        nothing: the worker decides it). An attempt that no longer owns its phase records nothing
        (:meth:`record_ended`, which raises :class:`~avsim.ledger.store.AttemptSuperseded`)."""
        if passes_only and result.outcome is not Outcome.PASSED:
            raise ValueError(
                f"{self.args.task_id}: only a passed attempt ends here, not {result.outcome.value}"
            )
        checked, result_doc = self.books.outputs_checked(result, attempt.output_uri)
        if passes_only and checked.outcome is not Outcome.PASSED:
            raise MissingOutputs(
                f"{self.args.task_id} attempt {attempt.attempt}: {checked.detail}: {checked.reason}"
            )
        result = checked
        rec = self.books.ended_record(
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
        return self._act(decision, rec, result, attempt, result_doc, task)

    def _act(
        self,
        decision: Decision,
        rec: AttemptRecord,
        result: AttemptResult,
        attempt: PhaseAttempt,
        result_doc: Any,
        task: TaskSide,
    ) -> Ended:
        """Carry out the policy's decision on an ended attempt that owns its phase."""
        if decision.action is Action.COMMIT:
            # A triage rerun stores nothing in the cache: its result is evidence for triage only.
            cache = not self.books.descriptor.triage_of
            final = self.books.commit_result(rec, result, attempt.cache_key, result_doc, cache=cache)
            if result.outcome is Outcome.SCENARIO_FAILED:
                self.log.warning(
                    "%s: the driving software failed the scenario (recorded as a result)",
                    self.where(attempt.attempt),
                )
            return Done(result_of(final))
        if decision.action is Action.HAND_OVER:
            task.ready_twin()
            twin = f"{self.args.task_id}{ON_DEMAND_SUFFIX}"
            return HandOver(
                f"{self.where(attempt.attempt)} was {decision.describe()} ({twin})",
                case=self.args.case.to_json(),
                run=self.books.descriptor.to_json(),
                twin_task_id=twin,
            )
        if decision.action is Action.RETRY:
            assert decision.failure is not None
            runner = f" [{rec.runner}]" if rec.runner else ""
            why = f"{result.reason or 'no reason given'} ({decision.describe()})"
            return Stop(
                decision.failure,
                f"{self.where(rec.attempt)} {class_of(result)}{runner}: {why}",
                retry_delay=dt.timedelta(seconds=decision.delay_seconds),
            )
        return self._commit_failure(rec, result, decision)

    def record_ended(self, rec: AttemptRecord, gpus: int) -> OutcomeRecord | None:
        """Fence, then record an ended attempt, emit its metrics and feed the build's breaker (a case's
        first attempt). The fence (:meth:`avsim.ledger.store.Ledger.end_attempt`) comes first, so a stale
        or duplicate report counts nothing: returns the phase's committed result when the attempt's end
        is settled already, None when the caller goes on to decide and commit. Raises
        :class:`avsim.ledger.store.AttemptSuperseded` when a newer try owns the phase uncommitted."""
        standing, committed = self.books.fence(rec)
        if standing is Standing.COMMITTED or (
            standing is Standing.SUPERSEDED and committed is not None and committed.outcome.produced_output
        ):
            assert committed is not None
            self.log.warning(
                "%s ended %s, but attempt %d's result is committed: returned, nothing recorded",
                self.where(rec.attempt),
                rec.outcome.value if rec.outcome else "?",
                committed.attempt,
            )
            return committed
        if standing is Standing.SUPERSEDED:
            current = self.books.current_attempt()
            raise AttemptSuperseded(
                f"{self.where(rec.attempt)} ended {rec.outcome.value if rec.outcome else '?'} after a newer "
                f"try took the phase over (attempt {current} is the current one): not recorded, counted "
                "or committed"
            )
        if standing is Standing.OWNED:
            self._measure(rec, gpus)
        return None

    def _measure(self, rec: AttemptRecord, gpus: int) -> None:
        """An ended attempt's metrics, and a case's first attempt in the build's breaker window."""
        assert rec.outcome is not None
        node_class, books = self.args.node_class, self.books
        self.meter.phase_outcome(self.phase, rec.outcome.value, "gpu" if gpus else "cpu", node_class)
        if gpus:
            self.meter.gpu_seconds(self.phase, rec.duration_seconds * gpus, node_class)
        if rec.outcome is Outcome.PREEMPTED:
            self.meter.preemption(self.phase, node_class)
        # A triage rerun is no evidence about any build: the week's own attempts were.
        first = (
            rec.attempt == 1
            and not contract.says_nothing_of_build(rec.outcome, rec.detail)
            and not self.args.is_run_level
            and not books.descriptor.triage_of
        )
        evidence = contract.is_build_evidence(rec.outcome, rec.detail)
        if first and books.feed_breaker(evidence, self.where(rec.attempt)):
            self.meter.breaker_trip(books.descriptor.build_id, books.breaker.digest)

    # -- ends without a launch ----------------------------------------------------------------------
    def _commit_failure(self, rec: AttemptRecord, result: AttemptResult, decision: Decision) -> Stop:
        """Commit a failure (no output) and say how the task fails."""
        self.books.commit_failure(rec, result)
        where = self.where(rec.attempt or None)
        what = f"{result.reason or result.outcome.value}" + (f" [{rec.runner}]" if rec.runner else "")
        assert decision.failure is not None
        if decision.action is Action.FAIL_FAST:
            if result.outcome is Outcome.BAD_BUILD:
                return Stop(decision.failure, f"{where}: bad build {self.books.descriptor.build_id}: {what}")
            return Stop(decision.failure, f"{where} rejected its input: {what}")
        return Stop(decision.failure, f"{where} failed ({class_of(result)}): {what}; {decision.describe()}")

    def _fail_without_launch(
        self, task: TaskSide, template: AttemptRecord, outcome: Outcome, detail: Detail, reason: str
    ) -> Stop:
        claimed = self.books.claim(template)
        ended = dataclasses.replace(
            claimed,
            state="ended",
            ended_at=utcnow().isoformat(),
            outcome=outcome,
            detail=detail,
            reason=reason,
        )
        self.books.record(ended)
        task.publish(published(ended))
        result = AttemptResult(outcome, reason=reason, detail=detail)
        return self._commit_failure(
            ended, result, Decision(Action.FAIL_FAST, outcome, policy.failure_for(outcome, detail))
        )

    def _reuse(self, template: AttemptRecord, key: str, hit: CacheEntry) -> Done:
        return Done(result_of(self.books.commit_reused(template, key, hit)))

    # -- after a deferral ---------------------------------------------------------------------------
    def committed_pass(self, attempt: int) -> Done | None:
        """The phase's result when attempt ``attempt`` committed a pass, else None."""
        found = self.books.committed()
        if found is None or found.attempt != attempt or found.outcome is not Outcome.PASSED:
            return None
        return Done(result_of(found))

    def committed_after_timeout(self) -> tuple[Done | None, int]:
        """After Airflow timed a deferral out: the phase's committed result, if one stands (a run-level
        phase's only from its current attempt), and the current attempt's number."""
        committed = self.books.committed()
        number = self.books.current_attempt() or 0
        if (
            committed is not None
            and committed.outcome.produced_output
            and (committed.attempt == number or not self.args.is_run_level)
        ):
            return Done(result_of(committed)), number
        return None, number
