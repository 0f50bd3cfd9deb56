"""What the week's own tasks hand each other: the canary plan and the shard summaries.

===================  ==========================================  =====================================
contract             written by                                  read by
===================  ==========================================  =====================================
:class:`CanaryPlan`  the weekly run's ``prepare`` (XCom          the canary gate (its sensor, and its
                     ``canary``; ``{}`` for a week without a     trigger through its ``plan`` argument)
                     canary stage)
:class:`ShardSummary`  a shard run's ``summarize``, and the      the shard operator, the verdicts, the
                     week's ``close_week`` for a shard run that  weekly report, ``avsim rerun-failed``,
                     never started (``ledger/shards/<k>/``       the canary gate (whether the canary
                     ``result.json``)                            finished this round)
===================  ==========================================  =====================================

A shard summary is a document of the artifact store that a running week keeps reading while a new
version of avsim is deployed: its field names are the ones the dicts it replaces had, so a summary
written before the models existed parses (``tests/unit/contracts/test_week.py`` holds one).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from avsim.contracts import ShardConf, _Contract
from avsim.phases.contract import Outcome

#: A case of a shard the week never started (the canary gate failed, the breaker was open): not an
#: attempt's class, so not an :class:`Outcome`.
NOT_STARTED: Final = "not_started"
#: A phase of a case that never ran: :data:`avsim.phases.contract.NOT_RUN`, typed as the literal the
#: models take (``tests/unit/contracts/test_week.py`` checks they are one name).
NOT_RUN: Final = "not_run"
#: The class of a phase in a shard summary: its committed outcome, ``upstream_failed`` when an upstream
#: phase produced nothing, or :data:`NOT_RUN`.
PhaseClass = Outcome | Literal["not_run"]
#: The class of a case in a shard summary: :func:`avsim.phases.contract.case_class` of its phases, or
#: :data:`NOT_STARTED`.
CaseClassInSummary = Outcome | Literal["not_started"]


def _name(cls: Outcome | str) -> str:
    return cls.value if isinstance(cls, Outcome) else cls


class CanaryPlan(_Contract):
    """The week's canary stage, as ``prepare`` plans it for the canary gate."""

    #: The canary's shard index (:data:`avsim.plan.shards.CANARY_SHARD`).
    shard: int = Field(default=0, ge=0, strict=True)
    #: The manifest's ``run.canary.max_failure_rate``: the gate fails above it.
    threshold: float = Field(ge=0, le=1)
    #: Canary case id -> the phase names of its graph family.
    cases: dict[str, tuple[str, ...]] = Field(min_length=1)
    #: The canary shard run's run id, and its conf.
    trigger_run_id: str = Field(min_length=1)
    conf: ShardConf


def canary_plan(value: Any) -> CanaryPlan | None:
    """The canary plan of ``prepare``'s XCom ``canary``: None for a week without a canary stage
    (``prepare`` pushes ``{}``), else the parsed plan (a bad one fails here, naming the field)."""
    if not value:
        return None
    return value if isinstance(value, CanaryPlan) else CanaryPlan.model_validate(value)


_OPTIONAL_PHASE_FIELDS = ("started_at", "ended_at", "gpus")


class PhaseSummary(_Contract):
    """One phase of a case in a shard summary: its committed attempt, or its last one when none is."""

    outcome: PhaseClass
    #: The committed attempt (the last one when none is committed; None when it never started).
    attempt: int | None = None
    output_uri: str = ""
    reason: str = ""
    duration_seconds: float | None = None
    #: How many attempts the phase made.
    attempts: int = Field(default=0, ge=0)
    #: When the phase's attempt (the committed one, else the last) started and ended, and the GPUs it
    #: held (:func:`avsim.ledger.summaries.summarize_shard` writes them; the report's case times and
    #: progress plot read them; a summary written before they were has none, and the report then takes
    #: the GPUs from the graph and leaves the times empty).
    started_at: str = ""
    ended_at: str = ""
    gpus: int | None = Field(default=None, ge=0)

    @model_serializer(mode="wrap")
    def _only_what_it_has(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The three optional fields are written only when set: a summary's JSON stays as before."""
        data: dict[str, Any] = handler(self)
        for key in _OPTIONAL_PHASE_FIELDS:
            if data.get(key) in ("", None):
                data.pop(key, None)
        return data

    @property
    def outcome_name(self) -> str:
        """The phase's class as serialized."""
        return _name(self.outcome)


class CaseSummary(_Contract):
    """One case of a shard summary: its class and each of its phases'."""

    case_id: str = Field(min_length=1)
    #: The case's graph family.
    graph: str = ""
    outcome: CaseClassInSummary
    #: Phase name -> its summary (empty for a case that never started).
    phases: dict[str, PhaseSummary] = Field(default_factory=dict)

    @property
    def outcome_name(self) -> str:
        """The case's class as serialized (the key of a summary's ``counts``)."""
        return _name(self.outcome)


class ShardSummary(_Contract):
    """A shard's summary in the ledger (``ledger/shards/<k>/result.json``)."""

    shard: int = Field(default=0, ge=0)
    cases: tuple[CaseSummary, ...] = ()
    #: ``cases`` and the number of cases of each class (results first).
    counts: dict[str, int] = Field(default_factory=dict)
    #: The shard's one-line verdict (:meth:`avsim.verdict.ShardVerdict.line`).
    verdict: str = ""
    #: When ``summarize`` wrote it (ISO-8601 UTC): the canary gate takes one written before its round
    #: began as the last round's. Empty for a shard run that never started.
    written_at: str = ""
    #: False for the summary ``close_week`` writes for a shard run the week never started, and why.
    started: bool = True
    stopped_because: str = ""
