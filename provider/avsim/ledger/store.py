"""The ledger in the artifact store (through ObjectStoragePath), and shard summaries built from it.

:class:`Ledger` claims attempts, records an attempt's end only while it owns its phase
(:func:`avsim.ledger.records.standing`) and commits one outcome per (case, phase): the first result
wins, a committed failure yields to a later attempt, and so does a run-level phase's result
(:func:`is_run_level`). Every write is compare-and-swap (:mod:`avsim.ledger.documents`). The rules:
docs/design.md, "Where state lives"; the paths: "Run ids and the artifact layout".
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, TypeVar

from avsim.artifacts import RUN_LEVEL_CASE, RunLayout
from avsim.contracts.week import ShardSummary
from avsim.errors import AvsimError
from avsim.ledger.documents import DocumentStore
from avsim.ledger.records import AttemptRecord, OutcomeRecord, Standing, standing
from avsim.storage import local_path

log = logging.getLogger(__name__)

#: Parallel reads against an object store.
READ_THREADS = 16
T = TypeVar("T")
R = TypeVar("R")


class AttemptSuperseded(AvsimError):
    """An attempt's end was reported after a newer try took its phase over (a claimed newer attempt,
    or this attempt recorded as abandoned): nothing of it is recorded, counted or committed."""


class CommitKind(enum.Enum):
    """What a commit does with the (case, phase)'s committed record (:func:`commit_rule`)."""

    FIRST = "first"  # nothing was committed: this is
    DUPLICATE = "duplicate"  # this attempt is committed already
    LATE = "late"  # a newer attempt is committed
    RESULT_KEPT = "result_kept"  # an earlier attempt's result is committed: the first result wins
    REPLACES = "replaces"  # an earlier attempt's failure is replaced


@dataclasses.dataclass(frozen=True)
class CommitDecision:
    kind: CommitKind
    existing: OutcomeRecord | None = None

    @property
    def writes(self) -> bool:
        return self.kind in (CommitKind.FIRST, CommitKind.REPLACES)


def commit_rule(existing: OutcomeRecord | None, rec: OutcomeRecord) -> CommitDecision:
    """The commit rule: the first record, or a newer attempt's over an earlier failure (a run-level
    phase's over an earlier result too); never an older attempt's, never over a result."""
    if existing is None:
        return CommitDecision(CommitKind.FIRST)
    if existing.attempt == rec.attempt:
        return CommitDecision(CommitKind.DUPLICATE, existing)
    if existing.attempt > rec.attempt:
        return CommitDecision(CommitKind.LATE, existing)
    if existing.outcome.produced_output and not is_run_level(rec.case_id):
        return CommitDecision(CommitKind.RESULT_KEPT, existing)
    return CommitDecision(CommitKind.REPLACES, existing)


def _log_commit(where: str, rec: OutcomeRecord, decision: CommitDecision) -> None:
    old = decision.existing
    was = f"attempt {old.attempt} ({old.outcome.value})" if old is not None else ""
    now = f"attempt {rec.attempt} ({rec.outcome.value})"
    if decision.kind is CommitKind.FIRST:
        log.info("%s: committed attempt %d as %s", where, rec.attempt, rec.outcome.value)
    elif decision.kind is CommitKind.DUPLICATE:
        log.info("%s: attempt %d is already committed; duplicate report ignored", where, rec.attempt)
    elif decision.kind is CommitKind.LATE:
        log.warning("%s: late report from abandoned %s ignored; %s is committed", where, now, was)
    elif decision.kind is CommitKind.RESULT_KEPT:
        log.warning(
            "%s: %s not committed: %s's result is committed and the first committed result wins",
            where,
            now,
            was,
        )
    else:
        log.info("%s: %s replaces committed %s", where, now, was)


class Ledger:
    """Attempts and committed outcomes of one run, in the artifact store under ``layout``."""

    def __init__(self, layout: RunLayout, documents: DocumentStore | None = None) -> None:
        self.layout = layout
        self.documents = documents or DocumentStore()
        #: Committed results seen by this ledger: final by the rules above (no attempt replaces a
        #: committed result), so reading one again asks the store nothing.
        self._results: dict[tuple[str, str], OutcomeRecord] = {}

    # -- storage --------------------------------------------------------------------------------
    @cached_property
    def is_local(self) -> bool:
        return local_path(self.layout.base) is not None

    def _read(self, uri: str) -> Any | None:
        return self.documents.read(uri)

    def _write(self, uri: str, data: Any) -> None:
        self.documents.put(uri, data)

    def _map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if self.is_local or len(items) < 2:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(
            max_workers=min(READ_THREADS, len(items)), thread_name_prefix="avsim-ledger"
        ) as ex:
            return list(ex.map(fn, items))

    def _list(self, uri: str, pattern: str) -> list[str]:
        """URIs of the documents under ``uri`` matching ``pattern``, as the store has them now."""
        return self.documents.list(uri, pattern)

    def _read_all(self, uris: Sequence[str]) -> list[Any]:
        """The documents at ``uris`` (None for one removed since it was listed), in order."""
        return self._map(self._read, uris)

    # -- attempts -------------------------------------------------------------------------------
    def current_uri(self, case_id: str, phase: str) -> str:
        return f"{self.layout.ledger}/current/{case_id}/{phase}.json"

    def current_attempt(self, case_id: str, phase: str) -> int | None:
        """The attempt number last claimed for a (case, phase), or None before the first claim."""
        doc = self._read(self.current_uri(case_id, phase))
        return int(doc["attempt"]) if isinstance(doc, dict) and "attempt" in doc else None

    def claim_attempt(self, template: AttemptRecord) -> AttemptRecord:
        """Claim the next attempt number of ``template``'s (case, phase) and record it as started.

        ``template`` carries everything but the number (its ``attempt`` is ignored); the returned
        record has the claimed number and its attempt-scoped ``output_uri``.
        """
        claimed: dict[str, Any] = {}

        def bump(current: Any | None) -> dict[str, Any]:
            n = int(current["attempt"]) + 1 if isinstance(current, dict) and "attempt" in current else 1
            claimed.clear()
            claimed.update(
                attempt=n,
                try_number=template.try_number,
                task_id=template.task_id,
                claimed_at=dt.datetime.now(dt.UTC).isoformat(),
            )
            return dict(claimed)

        self.documents.update(self.current_uri(template.case_id, template.phase), bump)
        n = int(claimed["attempt"])
        rec = _replace(
            template,
            attempt=n,
            state="started",
            output_uri=self.layout.attempt_output(template.case_id, template.phase, n),
        )
        self.record_attempt(rec)
        return rec

    def record_attempt(self, rec: AttemptRecord) -> None:
        self._write(self.layout.attempt_record(rec.case_id, rec.phase, rec.attempt), rec.to_json())

    def end_attempt(self, rec: AttemptRecord) -> tuple[Standing, OutcomeRecord | None]:
        """Record ``rec``, an attempt's end, when the attempt still owns its phase: the fence every side
        effect of an end waits for (the worker's and the committing trigger's).

        Reads the phase's committed outcome and current attempt, then decides with
        :func:`~avsim.ledger.records.standing` inside a compare-and-swap of the attempt's record, so of
        two writers racing to end one attempt exactly one gets :attr:`Standing.OWNED` (and writes).
        Returns the standing and the phase's committed outcome as read.
        """
        committed = self.outcome(rec.case_id, rec.phase)
        current = self.current_attempt(rec.case_id, rec.phase)
        found: list[Standing] = []

        def end(doc: Any | None) -> dict[str, Any] | None:
            existing = AttemptRecord.from_json(doc) if isinstance(doc, dict) else None
            found[:] = [standing(rec, current=current, existing=existing, committed=committed)]
            return rec.to_json() if found[0] is Standing.OWNED else None

        self.documents.update(self.layout.attempt_record(rec.case_id, rec.phase, rec.attempt), end)
        if found[0] is not Standing.OWNED:
            log.warning(
                "phase %r of case %r: the end of attempt %d (%s) is %s (current attempt %s): not recorded",
                rec.phase,
                rec.case_id,
                rec.attempt,
                rec.outcome.value if rec.outcome else "?",
                found[0].value,
                current,
            )
        return found[0], committed

    def settle_attempt(self, rec: AttemptRecord) -> AttemptRecord:
        """Write ``rec``, an end a newer try settles for an earlier try's attempt (``abandoned``), only
        while the attempt's stored record is still ``started``: a compare-and-swap, so an end its own
        worker or trigger recorded meanwhile (a pass) is never overwritten. Returns the attempt's record
        as it stands after the swap (``rec``, or the end that was recorded first)."""

        def settle(doc: Any | None) -> dict[str, Any] | None:
            if isinstance(doc, dict) and AttemptRecord.from_json(doc).ended:
                return None
            return rec.to_json()

        held = self.documents.update(self.layout.attempt_record(rec.case_id, rec.phase, rec.attempt), settle)
        return AttemptRecord.from_json(held) if isinstance(held, dict) else rec

    def attempts(self, case_id: str, phase: str) -> list[AttemptRecord]:
        """Every recorded attempt of a (case, phase), lowest attempt first."""
        folder = self.layout.attempt_record(case_id, phase, 0).rsplit("/", 1)[0]
        docs = [self._read(uri) for uri in self._list(folder, "*.json")]
        records = [AttemptRecord.from_json(d) for d in docs if d is not None]
        return sorted(records, key=lambda r: r.attempt)

    # -- committed outcomes ---------------------------------------------------------------------
    def outcome(self, case_id: str, phase: str) -> OutcomeRecord | None:
        known = self._results.get((case_id, phase))
        if known is not None:
            return known
        data = self._read(self.layout.outcome_record(case_id, phase))
        return self._seen(OutcomeRecord.from_json(data)) if data is not None else None

    def _seen(self, rec: OutcomeRecord) -> OutcomeRecord:
        if rec.outcome.produced_output and not is_run_level(rec.case_id):
            self._results[(rec.case_id, rec.phase)] = rec
        return rec

    def commit(self, rec: OutcomeRecord, *, fenced: bool = False) -> bool:
        """Commit ``rec`` as the outcome of its (case, phase) under the rules above.

        ``fenced``: the caller's :meth:`end_attempt` just found the attempt the phase's owner, so the
        current attempt is not read again (a newer claim in between changes nothing: the first commit
        still wins). True when the committed record changed.
        """
        where = f"phase {rec.phase!r} of case {rec.case_id!r}"
        current = None if fenced else self.current_attempt(rec.case_id, rec.phase)
        if current is not None and rec.attempt != current:
            log.warning(
                "%s: late report from abandoned attempt %d (%s) ignored; attempt %d is the current one",
                where,
                rec.attempt,
                rec.outcome.value,
                current,
            )
            return False
        decided: list[CommitDecision] = []

        def decide(existing_doc: Any | None) -> dict[str, Any] | None:
            existing = None if existing_doc is None else OutcomeRecord.from_json(existing_doc)
            decided[:] = [commit_rule(existing, rec)]
            return rec.to_json() if decided[0].writes else None

        self.documents.update(self.layout.outcome_record(rec.case_id, rec.phase), decide)
        decision = decided[0]
        self._seen(rec if decision.writes or decision.existing is None else decision.existing)
        _log_commit(where, rec, decision)
        return decision.writes

    def outcomes_for(
        self, case_ids: Iterable[str], phases: Iterable[str]
    ) -> dict[tuple[str, str], OutcomeRecord]:
        """The committed outcomes of every (case, phase) pair that has one."""
        names = list(phases)
        keys = [(c, p) for c in case_ids for p in names]
        found = self._map(lambda k: self.outcome(*k), keys)
        return {k: rec for k, rec in zip(keys, found, strict=True) if rec is not None}

    # -- shard summaries ------------------------------------------------------------------------
    def write_shard_summary(self, summary: ShardSummary) -> str:
        uri = self.layout.shard_summary(summary.shard)
        self._write(uri, summary.to_json())
        return uri

    def shard_summary(self, shard: int) -> ShardSummary | None:
        """A shard's summary, or None before its shard run (or ``close_week``) wrote one."""
        doc = self._read(self.layout.shard_summary(shard))
        return ShardSummary.model_validate(doc) if doc is not None else None

    def shard_summaries(self) -> list[ShardSummary]:
        """Every shard's summary, by shard index (one that does not parse fails here, naming its field)."""
        docs = self._read_all(self._list(f"{self.layout.ledger}/shards", "*/result.json"))
        found = [ShardSummary.model_validate(d) for d in docs if d is not None]
        return sorted(found, key=lambda s: s.shard)

    # -- repairs in place ---------------------------------------------------------------------------
    def record_repair(self, shard: int, parent_try: int, doc: dict[str, Any]) -> str:
        """Record that a cleared ``shards`` task (try ``parent_try``) cleared its failed shard run."""
        uri = f"{self.layout.ledger}/repairs/{shard:05d}-{parent_try:03d}.json"
        self._write(uri, doc)
        return uri

    def repairs(self) -> list[dict[str, Any]]:
        """Every repair in place of this run, oldest first."""
        docs = [
            d
            for d in self._read_all(self._list(f"{self.layout.ledger}/repairs", "*.json"))
            if isinstance(d, dict)
        ]
        return sorted(docs, key=lambda d: (str(d.get("at", "")), int(d.get("shard", 0))))

    def phase_states(
        self, keys: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[OutcomeRecord | None, list[AttemptRecord]]]:
        """Committed outcome and attempts of each (case, phase), read in parallel on object stores."""
        found = self._map(lambda k: (self.outcome(*k), self.attempts(*k)), keys)
        return dict(zip(keys, found, strict=True))


def is_run_level(case_id: str) -> bool:
    """A run-level phase's (case) id: its committed result is replaced by a later attempt's."""
    return case_id == RUN_LEVEL_CASE


def _replace(rec: AttemptRecord, **changes: Any) -> AttemptRecord:
    import dataclasses

    return dataclasses.replace(rec, **changes)
