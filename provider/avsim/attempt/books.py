"""The books an attempt is kept in: where a phase's run, ledger, breaker and cache are, and every
ledger write of an attempt. No Airflow here, and no decision.

:class:`AttemptBooks` is held by :class:`avsim.attempt.service.AttemptService`, which decides (begin,
end) and has the books write what it decided: a claim, a lost attempt settled, an ended attempt's
record behind the ledger's fence, the breaker's window, a result's commit and its cache entry, a
failure's commit, a reused result.
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
from avsim.contracts import PhaseResult, RunDescriptor
from avsim.contracts.case import CacheEntry
from avsim.errors import AvsimError
from avsim.ledger.breaker import Breaker
from avsim.ledger.cache import PhaseCache
from avsim.ledger.records import AttemptRecord, OutcomeRecord, Standing
from avsim.ledger.store import Ledger
from avsim.phases import contract
from avsim.phases.contract import AttemptResult, Detail, Outcome

__all__ = ["AttemptBooks", "class_of", "patiently", "published", "result_of", "utcnow"]

T = TypeVar("T")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AttemptBooks:
    """One phase task's books, over the run's ledger, breaker and cache (:mod:`avsim.ledger`).

    :param args: the task's phase arguments, rendered.
    :param log: the task's logger.
    """

    def __init__(self, args: PhaseArgs, *, log: logging.Logger | Any = None) -> None:
        self.args = args
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

    def runtime_spec(self) -> dict[str, Any]:
        if self.args.is_run_level:
            return dict(self.head["run_phases"][self.phase])
        return self.args.case.phase_spec(self.head, self.phase)

    # -- reads --------------------------------------------------------------------------------------
    def committed(self) -> OutcomeRecord | None:
        return self.ledger.outcome(self.args.case_id, self.phase)

    def attempts(self) -> list[AttemptRecord]:
        return self.ledger.attempts(self.args.case_id, self.phase)

    def current_attempt(self) -> int | None:
        return self.ledger.current_attempt(self.args.case_id, self.phase)

    def attempt_record(self, attempt: int) -> AttemptRecord | None:
        """Attempt ``attempt``'s own record (None when it cannot be read)."""
        from avsim.storage import read_json

        try:
            return AttemptRecord.from_json(
                read_json(self.layout.attempt_record(self.args.case_id, self.phase, attempt))
            )
        except (FileNotFoundError, OSError, ValueError, KeyError):
            return None

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
            self.log.error("%s: %s", self.args.where(), checked.reason)
            return checked, None
        checked = contract.classify_outputs(result, missing)
        if checked is not result:
            self.log.error("%s: %s", self.args.where(), checked.reason)
        return checked, doc

    def attempt_of_try(self, try_number: int, task_id: str) -> int | None:
        """The attempt try ``try_number`` of task ``task_id`` claimed last (None: it claimed none)."""
        mine = [
            r.attempt
            for r in self.attempts()
            if r.try_number == try_number and (not r.task_id or r.task_id == task_id)
        ]
        return max(mine, default=None)

    def started_at(self, attempt: int) -> dt.datetime:
        """When attempt ``attempt`` was claimed (now, when its record is not found)."""
        records = [r for r in self.attempts() if r.attempt == attempt]
        if records and records[-1].started_at:
            return dt.datetime.fromisoformat(records[-1].started_at)
        return utcnow()

    # -- records ------------------------------------------------------------------------------------
    def started_record(self, try_number: int, round_start: int, gpus: int) -> AttemptRecord:
        return AttemptRecord(  # an attempt a try starts: its number is the ledger's claim
            run_key=self.layout.run_key,
            case_id=self.args.case_id,
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
            try_number=try_number,
            task_id=self.args.task_id,
            round_start=round_start,
            node_class=self.args.node_class,
            gpus=gpus,
        )

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
        ended = utcnow()  # the record of an attempt that ended with ``result``
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

    # -- writes -------------------------------------------------------------------------------------
    def claim(self, template: AttemptRecord) -> AttemptRecord:
        """Claim the phase's next attempt number (:meth:`Ledger.claim_attempt`)."""
        return self.ledger.claim_attempt(template)

    def settle(self, lost: AttemptRecord) -> AttemptRecord:
        """Write ``lost`` only while its attempt's record is still ``started``; the record as it stands."""
        return self.ledger.settle_attempt(lost)

    def record(self, rec: AttemptRecord) -> None:
        self.ledger.record_attempt(rec)  # an attempt that ended without a launch

    def fence(self, rec: AttemptRecord) -> tuple[Standing, OutcomeRecord | None]:
        """Write an ended attempt's record behind the fence (:meth:`Ledger.end_attempt`): its standing."""
        return self.ledger.end_attempt(rec)

    def feed_breaker(self, evidence: bool, where: str) -> bool:
        """One attempt in the build's breaker window; whether that tripped the breaker."""
        return self.breaker.record(evidence, where)

    def commit_result(
        self, rec: AttemptRecord, result: AttemptResult, cache_key: str, result_doc: Any, *, cache: bool
    ) -> OutcomeRecord:
        """Commit an attempt's output behind the fence (the first commit of a phase wins,
        :meth:`Ledger.commit`), and with ``cache`` store it in the cache: the phase's committed outcome."""
        out = self._outcome_record(rec, result, output=True, cache_key=cache_key, result_doc=result_doc)
        self.ledger.commit(out, fenced=True)
        final = self.ledger.outcome(rec.case_id, self.phase) or out
        if cache and final.cache_key and final.attempt == rec.attempt:
            self.cache.store(final.cache_key, final)
        return final

    def commit_failure(self, rec: AttemptRecord, result: AttemptResult) -> None:
        self.ledger.commit(self._outcome_record(rec, result, output=False))

    def commit_reused(self, template: AttemptRecord, key: str, hit: CacheEntry) -> OutcomeRecord:
        """Claim an attempt, record it reused and commit the cached ``hit``: the committed outcome."""
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
            self.args.where(),
            rec.output_uri,
            key[:12],
        )
        return self.ledger.outcome(claimed.case_id, self.phase) or rec


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
