"""The ledger's records: what one attempt did, and the committed outcome of a (case, phase); and the
fence on an attempt's end (:func:`standing`), a pure decision over them.

Both are plain frozen dataclasses with a JSON form (``to_json`` gives a JSON-ready dict,
``from_json`` takes one back, ignoring keys it does not know so older readers survive newer
records).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from avsim.phases.contract import Outcome


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of one phase of one case: written ``started`` when claimed, ``ended`` when it ends.

    ``attempt`` numbers are claimed from the ledger (1, 2, ... per case and phase, whichever task
    ran them), so a phase that moved from spot to on-demand nodes keeps one sequence. ``try_number``
    and ``task_id`` say which Airflow task instance try ran it; ``round_start`` is the first try of
    the task's current round of retries (a clear starts a new round with fresh budgets).
    """

    run_key: str
    case_id: str
    phase: str
    attempt: int
    started_at: str
    ended_at: str
    exit_code: int | None
    outcome: Outcome | None
    reason: str
    output_uri: str
    host: str
    duration_seconds: float
    state: str = "ended"  # started | ended
    try_number: int = 0
    task_id: str = ""
    round_start: int = 1
    node_class: str = ""
    gpus: int = 0
    #: What the platform did, in a word (oom, evicted, lease_expired, node_lost, image_pull, ...).
    detail: str = ""
    #: The pod or process that ran the attempt.
    runner: str = ""

    @property
    def ended(self) -> bool:
        return self.state == "ended"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value if self.outcome is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptRecord:
        d = _known(cls, data)
        outcome = d.get("outcome")
        exit_code = d.get("exit_code")
        return cls(
            run_key=str(d.get("run_key", "")),
            case_id=str(d["case_id"]),
            phase=str(d["phase"]),
            attempt=int(d["attempt"]),
            started_at=str(d.get("started_at", "")),
            ended_at=str(d.get("ended_at", "")),
            exit_code=int(exit_code) if exit_code is not None else None,
            outcome=Outcome(outcome) if outcome else None,
            reason=str(d.get("reason", "")),
            output_uri=str(d.get("output_uri", "")),
            host=str(d.get("host", "")),
            duration_seconds=float(d.get("duration_seconds") or 0.0),
            state=str(d.get("state", "ended")),
            try_number=int(d.get("try_number") or 0),
            task_id=str(d.get("task_id", "")),
            round_start=int(d.get("round_start") or 1),
            node_class=str(d.get("node_class", "")),
            gpus=int(d.get("gpus") or 0),
            detail=str(d.get("detail", "")),
            runner=str(d.get("runner", "")),
        )


@dataclass(frozen=True)
class OutcomeRecord:
    """The committed outcome of a (case, phase): the attempt whose result counts.

    ``result`` is kept small (the phase's metrics), so a shard summary can be built from
    outcome records alone.
    """

    run_key: str
    case_id: str
    phase: str
    attempt: int
    outcome: Outcome
    output_uri: str
    committed_at: str
    reason: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    #: The phase's cache key (build digest, phase spec, inputs, seed); see :mod:`avsim.ledger.cache`.
    cache_key: str = ""
    #: Where a reused output came from (another run's committed outcome), empty when computed here.
    reused_from: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutcomeRecord:
        d = _known(cls, data)
        result = d.get("result")
        return cls(
            run_key=str(d.get("run_key", "")),
            case_id=str(d["case_id"]),
            phase=str(d["phase"]),
            attempt=int(d["attempt"]),
            outcome=Outcome(d["outcome"]),
            output_uri=str(d.get("output_uri", "")),
            committed_at=str(d.get("committed_at", "")),
            reason=str(d.get("reason", "")),
            result=dict(result) if isinstance(result, Mapping) else {},
            cache_key=str(d.get("cache_key", "")),
            reused_from=str(d.get("reused_from", "")),
            detail=str(d.get("detail", "")),
        )


class Standing(str, Enum):
    """Where an attempt that ended stands in its phase: whether its end may still be recorded, counted
    and committed (see :func:`standing`)."""

    #: The phase's current attempt, not ended yet: record its end, count it, feed the breaker, commit.
    OWNED = "owned"
    #: Its end was recorded already with the same outcome (another triggerer running the same trigger,
    #: or the trigger before a commit it could not make): counted once already; commit it (idempotent).
    RECORDED = "recorded"
    #: The attempt's result is committed: nothing to record; the committed result is the phase's.
    COMMITTED = "committed"
    #: A newer attempt was claimed, or a newer try recorded this attempt's end otherwise (``abandoned``):
    #: a stale report. Nothing is recorded, counted or committed.
    SUPERSEDED = "superseded"


def standing(
    ending: AttemptRecord,
    *,
    current: int | None,
    existing: AttemptRecord | None,
    committed: OutcomeRecord | None,
) -> Standing:
    """The fence on an attempt's end: where ``ending`` (the ended record a worker or a trigger is about
    to write) stands, given the phase's ``current`` attempt number, the attempt's stored record
    (``existing``) and the phase's ``committed`` outcome. Decided before anything is written, counted or
    committed, so a stale or duplicate report has no side effect."""
    if committed is not None and committed.outcome.produced_output and committed.attempt == ending.attempt:
        return Standing.COMMITTED
    if current is not None and current != ending.attempt:
        return Standing.SUPERSEDED
    if existing is not None and existing.ended:
        same = existing.outcome is ending.outcome and existing.detail == ending.detail
        return Standing.RECORDED if same else Standing.SUPERSEDED
    return Standing.OWNED
