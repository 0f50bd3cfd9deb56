"""The books an attempt is kept in: where a phase's run, ledger, breaker and cache are, and how an
attempt's end is recorded, measured and committed. No Airflow here.

:class:`AttemptBooks` is the base of :class:`avsim.attempt.service.AttemptService`, which decides
(begin, end); this module only writes what was decided: an ended attempt's record behind the
ledger's fence (:meth:`AttemptBooks.record_ended`), its metrics and the build's breaker window, a
result's commit and its cache entry, a failure's commit, a reused result.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import socket
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

from avsim.artifacts import RunLayout
from avsim.attempt.args import PhaseArgs
from avsim.attempt.steps import Done, Meter, Stop, TaskSide
from avsim.contracts import PhaseResult, RunDescriptor
from avsim.contracts.case import CacheEntry
from avsim.errors import AvsimError
from avsim.ledger.breaker import Breaker
from avsim.ledger.cache import PhaseCache
from avsim.ledger.records import AttemptRecord, OutcomeRecord, Standing
from avsim.ledger.store import AttemptSuperseded, Ledger
from avsim.phases import contract, policy
from avsim.phases.contract import AttemptResult, Detail, Outcome
from avsim.phases.policy import Action, Decision

__all__ = ["AttemptBooks", "class_of", "patiently", "published", "result_of", "utcnow"]

T = TypeVar("T")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AttemptBooks:
    """One phase task's books, over the run's ledger, breaker and cache (:mod:`avsim.ledger`).

    :param args: the task's phase arguments, rendered.
    :param meter: where metrics go (:mod:`avsim.metrics` in a task or a trigger).
    :param log: the task's logger.
    """

    def __init__(self, args: PhaseArgs, *, meter: Meter, log: logging.Logger | Any = None) -> None:
        self.args = args
        self.meter = meter
        self.log = log or logging.getLogger(__name__)

    # -- where things are ---------------------------------------------------------------------------
    @cached_property
    def descriptor(self) -> RunDescriptor:
        """The run this phase belongs to (``run``, as ``prepare`` described it)."""
        if self.args.run is None:
            raise AvsimError(
                f"{self.args.task_id}: no run descriptor; a shard run's conf carries it, and shard runs are "
                "started by the weekly run"
            )
        return self.args.run

    @cached_property
    def layout(self) -> RunLayout:
        return self.descriptor.layout

    @cached_property
    def ledger(self) -> Ledger:
        return Ledger(self.layout)

    @cached_property
    def head(self) -> dict[str, Any]:
        from avsim.storage import read_json

        return dict(read_json(self.layout.head_uri))

    @cached_property
    def breaker(self) -> Breaker:
        from avsim.ledger.breaker import BreakerConfig, image_digest

        return Breaker(
            self.layout.root,
            image_digest(self.descriptor.image),
            build_id=self.descriptor.build_id,
            config=BreakerConfig.from_head(self.head),
            documents=self.ledger.documents,
        )

    @cached_property
    def cache(self) -> PhaseCache:
        return PhaseCache(self.layout.root, self.ledger.documents)

    @property
    def phase(self) -> str:
        return self.args.phase

    def where(self, attempt: int | None = None) -> str:
        return self.args.where(attempt)

    def runtime_spec(self) -> dict[str, Any]:
        if self.args.is_run_level:
            return dict(self.head["run_phases"][self.phase])
        return self.args.case.phase_spec(self.head, self.phase)

    def ended_record(
        self,
        *,
        attempt: int,
        output_uri: str,
        gpus: int,
        try_number: int,
        round_start: int,
        result: AttemptResult,
        started: dt.datetime,
    ) -> AttemptRecord:
        """The ledger's record of an attempt that ended with ``result``: what the worker that resumes
        the phase and the trigger that ends a passed one (:meth:`commit_passed`) write."""
        ended = utcnow()
        return AttemptRecord(
            run_key=self.layout.run_key,
            case_id=self.args.case_id,
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
            task_id=self.args.task_id,
            round_start=round_start,
            node_class=self.args.node_class,
            gpus=gpus,
            detail=result.detail,
            runner=result.runner,
        )

    def record_ended(self, rec: AttemptRecord, gpus: int) -> OutcomeRecord | None:
        """Fence, then write an ended attempt's record, emit its metrics and feed the build's breaker
        (a case's first attempt): the worker's and the committing trigger's one way to end an attempt.

        The fence (:meth:`avsim.ledger.store.Ledger.end_attempt`) comes first, so a stale or duplicate
        report counts nothing: returns the phase's committed result when the attempt's end is settled
        already (this attempt committed, or a newer one did), None when the caller goes on to decide
        and commit. Raises :class:`avsim.ledger.store.AttemptSuperseded` when a newer try owns the
        phase and nothing is committed."""
        standing, committed = self.ledger.end_attempt(rec)
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
            current = self.ledger.current_attempt(rec.case_id, rec.phase)
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
        node_class = self.args.node_class
        self.meter.phase_outcome(self.phase, rec.outcome.value, "gpu" if gpus else "cpu", node_class)
        if gpus:
            self.meter.gpu_seconds(self.phase, rec.duration_seconds * gpus, node_class)
        if rec.outcome is Outcome.PREEMPTED:
            self.meter.preemption(self.phase, node_class)
        # A triage rerun is no evidence about any build: the week's own attempts were.
        first = (
            rec.attempt == 1
            and rec.outcome is not Outcome.PREEMPTED
            and not self.args.is_run_level
            and not self.descriptor.triage_of
        )
        evidence = contract.is_build_evidence(rec.outcome, rec.detail)
        if first and self.breaker.record(evidence, self.where(rec.attempt)):
            self.meter.breaker_trip(self.descriptor.build_id, self.breaker.digest)

    def outputs_checked(self, result: AttemptResult, output_uri: str) -> tuple[AttemptResult, Any]:
        """``result`` checked against the outputs the attempt declares (the phase contract's
        :func:`~avsim.phases.contract.classify_outputs`), and its ``result.json`` (None when unread):
        a result whose declared outputs are missing is ``infra_failed``/``missing_output``."""
        if not result.outcome.produced_output:
            return result, None
        try:
            doc, missing = patiently(lambda: _missing_outputs(output_uri), STORE_PATIENCE_SECONDS)
        except Exception as exc:  # the store did not answer: neither the phase's failure nor the build's
            checked = dataclasses.replace(
                result,
                outcome=Outcome.INFRA_FAILED,
                detail=Detail.STORAGE_UNAVAILABLE,
                reason=f"its outputs could not be checked: the artifact store did not answer for "
                f"{STORE_PATIENCE_SECONDS:g}s ({type(exc).__name__}: {str(exc)[:200]})",
            )
            self.log.error("%s: %s", self.where(), checked.reason)
            return checked, None
        checked = contract.classify_outputs(result, missing)
        if checked is not result:
            self.log.error("%s: %s", self.where(), checked.reason)
        return checked, doc

    # -- commit -------------------------------------------------------------------------------------
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
            committed_at=utcnow().isoformat(),
            reason=result.reason[-500:],
            result=_small_result(rec.output_uri, result_doc) if output else {},
            cache_key=cache_key if output else "",
            detail=result.detail,
        )

    def _commit_failure(self, rec: AttemptRecord, result: AttemptResult, decision: Decision) -> Stop:
        """Commit a failure (no output) and say how the task fails."""
        self.ledger.commit(self._outcome_record(rec, result, output=False))
        where = self.where(rec.attempt or None)
        what = f"{result.reason or result.outcome.value}" + (f" [{rec.runner}]" if rec.runner else "")
        assert decision.failure is not None
        if decision.action is Action.FAIL_FAST:
            if result.outcome is Outcome.BAD_BUILD:
                return Stop(decision.failure, f"{where}: bad build {self.descriptor.build_id}: {what}")
            return Stop(decision.failure, f"{where} rejected its input: {what}")
        return Stop(decision.failure, f"{where} failed ({class_of(result)}): {what}; {decision.describe()}")

    def _fail_without_launch(
        self, task: TaskSide, template: AttemptRecord, outcome: Outcome, detail: Detail, reason: str
    ) -> Stop:
        claimed = self.ledger.claim_attempt(template)
        ended = dataclasses.replace(
            claimed,
            state="ended",
            ended_at=utcnow().isoformat(),
            outcome=outcome,
            detail=detail,
            reason=reason,
        )
        self.ledger.record_attempt(ended)
        task.publish(published(ended))
        result = AttemptResult(outcome, reason=reason, detail=detail)
        return self._commit_failure(
            ended, result, Decision(Action.FAIL_FAST, outcome, policy.failure_for(outcome, detail))
        )

    def _commit_reused(self, template: AttemptRecord, key: str, hit: CacheEntry) -> Done:
        claimed = self.ledger.claim_attempt(template)
        now = utcnow().isoformat()
        self.ledger.record_attempt(
            dataclasses.replace(
                claimed,
                state="ended",
                ended_at=now,
                outcome=hit.outcome,
                output_uri=hit.output_uri,
                detail=Detail.REUSED,
                reason=f"reused the committed output of run {hit.run_key} (cache key {key[:12]})",
            )
        )
        rec = OutcomeRecord(
            run_key=self.layout.run_key,
            case_id=claimed.case_id,
            phase=self.phase,
            attempt=claimed.attempt,
            outcome=hit.outcome,
            output_uri=hit.output_uri,
            committed_at=now,
            result=dict(hit.result),
            cache_key=key,
            reused_from=hit.origin,
            detail=Detail.REUSED,
        )
        self.ledger.commit(rec)
        self.log.info(
            "%s: reused the committed output %s (cache key %s): nothing launched",
            self.where(),
            rec.output_uri,
            key[:12],
        )
        return Done(result_of(self.ledger.outcome(claimed.case_id, self.phase) or rec))


# -- the store's answers ---------------------------------------------------------------------------
#: How long an attempt's end waits for an artifact store that does not answer (a blip, a failover)
#: before it is recorded ``infra_failed``/``storage_unavailable``.
STORE_PATIENCE_SECONDS = 60.0


def patiently(read: Callable[[], T], patience_seconds: float) -> T:
    """``read()``, again after 1, 2, 4, ... s (at most 10 s apart) while it fails other than with
    FileNotFoundError or ValueError (answers, not outages), until ``patience_seconds`` have passed:
    then its last error is raised."""
    began, delay = time.monotonic(), 1.0
    while True:
        try:
            return read()
        except (FileNotFoundError, ValueError):
            raise
        except Exception:
            if time.monotonic() - began + delay > patience_seconds:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 10.0)


def _missing_outputs(output_uri: str) -> tuple[Any, list[str]]:
    """``result.json`` under ``output_uri`` (None when absent or not JSON) and the declared outputs
    missing there."""
    from avsim import storage

    try:
        doc = storage.read_json(f"{output_uri}/{contract.RESULT_FILE}")
    except (FileNotFoundError, ValueError):
        doc = None
    missing = [
        name
        for name in contract.declared_outputs(doc)
        if (doc is None if name == contract.RESULT_FILE else not storage.exists(f"{output_uri}/{name}"))
    ]
    return doc, missing


# -- answers --------------------------------------------------------------------------------------
def result_of(rec: OutcomeRecord) -> PhaseResult:
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
    )


def published(rec: AttemptRecord, outcome: Outcome | None = None) -> PhaseResult:
    """How an attempt that committed no result ended (XCom ``avsim_outcome``, for the pages): a failed
    or retried task's class without a ledger read."""
    outcome = outcome or rec.outcome
    assert outcome is not None
    return PhaseResult(
        case_id=rec.case_id,
        phase=rec.phase,
        outcome=outcome,
        attempt=rec.attempt,
        detail=rec.detail,
        reason=rec.reason[-300:],
    )


def class_of(result: AttemptResult) -> str:
    return result.outcome.value + (f"/{result.detail}" if result.detail else "")


def _small_result(output_uri: str, data: Any = None) -> dict[str, Any]:
    from avsim.storage import read_json

    try:
        data = data if data is not None else read_json(f"{output_uri}/result.json")
    except (FileNotFoundError, OSError, ValueError):
        return {}
    metrics = data.get("metrics", {}) if isinstance(data, dict) else {}
    return {"metrics": metrics} if isinstance(metrics, dict) else {}
