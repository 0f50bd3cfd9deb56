"""The triage document: each newly failing case's reruns and verdict, and the determinism audit.

Frozen pydantic models (``extra="forbid"``): what the triage task writes to ``report/triage.json``
and what the report, the page and ``avsim triage`` read back (:meth:`TriageReport.model_validate_json`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from avsim.phases.contract import Outcome

TRIAGE_SCHEMA: Final = "avsim/triage/v1"
#: The outcomes of a rerun that are a result of the scenario (anything else: the rerun did not really run).
RESULTS = (Outcome.PASSED, Outcome.SCENARIO_FAILED)


class TriageVerdict(StrEnum):
    """What a newly failing case's reruns say about it."""

    REGRESSION = "regression"  # fails on this build every time, passes on last week's
    FLAKY = "flaky"  # passes on a rerun of this build, or fails on last week's too
    ENVIRONMENT = "environment"  # the reruns could not run or ended in infrastructure failures
    NOT_TRIAGED = "not_triaged"  # no rerun: the budget or the deadline left no room


class BuildSide(StrEnum):
    THIS = "this"  # this week's build
    LAST = "last"  # last week's pinned build


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rerun(_Model):
    """One rerun of a case's failing phase and its downstream on one build."""

    case_id: str = Field(min_length=1)
    build: BuildSide
    build_digest: str = Field(min_length=1)
    #: 1, 2, ... among the reruns of this case on this build.
    index: int = Field(ge=1)
    #: The class the ledger recorded for the rerun's attempt; None: the rerun could not start.
    outcome: Outcome | None = None
    reason: str = ""
    #: Where the rerun's attempt wrote (its logs).
    output_uri: str = ""

    @model_validator(mode="after")
    def _says_why(self) -> Rerun:
        if self.outcome is None and not self.reason:
            raise ValueError(f"rerun {self.index} of {self.case_id} did not start: give its reason")
        return self

    @property
    def is_result(self) -> bool:
        """The rerun ran the scenario to a result (passed or failed it)."""
        return self.outcome in RESULTS


class NewlyFailing(_Model):
    """A case that failed its scenario this week and passed last week, and the phase that failed."""

    case_id: str = Field(min_length=1)
    previous_case_id: str = ""
    scenario_uri: str = ""
    graph: str = ""
    failing_phase: str = Field(min_length=1)


class CaseTriage(NewlyFailing):
    """A newly failing case: where it failed, its reruns, and the verdict they give."""

    reruns: tuple[Rerun, ...] = ()
    verdict: TriageVerdict
    reason: str = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> CaseTriage:
        strangers = sorted({r.case_id for r in self.reruns} - {self.case_id})
        if strangers:
            raise ValueError(f"case {self.case_id} lists reruns of other cases: {strangers}")
        if self.verdict is TriageVerdict.NOT_TRIAGED and self.reruns:
            raise ValueError(f"case {self.case_id} is not triaged but lists reruns")
        return self


class OutputDifference(_Model):
    """A declared deterministic output whose digest differs between a passed case and its rerun."""

    case_id: str = Field(min_length=1)
    phase: str = Field(min_length=1)
    output: str = Field(min_length=1)
    first: str | None  # the week's digest (None: the output is missing)
    again: str | None  # the rerun's digest


class DeterminismAudit(_Model):
    """Passed cases rerun on this build with the same seed, and the outputs that came out different."""

    passed_cases: int = Field(ge=0)
    sampled: tuple[str, ...] = ()
    differing: tuple[OutputDifference, ...] = ()
    #: Share of the sampled cases with at least one differing output.
    rate: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _within_sample(self) -> DeterminismAudit:
        outside = sorted({d.case_id for d in self.differing} - set(self.sampled))
        if outside:
            raise ValueError(f"differing cases {outside} are not in the audit's sample")
        return self

    @classmethod
    def of(cls, passed_cases: int, sampled: Iterable[str], differing: Iterable[OutputDifference]) -> Any:
        sample, diffs = tuple(sampled), tuple(differing)
        rate = len({d.case_id for d in diffs}) / len(sample) if sample else 0.0
        return cls(passed_cases=passed_cases, sampled=sample, differing=diffs, rate=rate)


class Confirmation(_Model):
    """A newly passing case rerun once on this build (``[avsim] triage_confirm_passing``)."""

    case_id: str = Field(min_length=1)
    #: The rerun's class; None: it did not end (the reason says why).
    outcome: Outcome | None = None
    reason: str = ""
    output_uri: str = ""

    @property
    def confirmed(self) -> bool:
        return self.outcome is Outcome.PASSED


def verdict_counts(cases: Iterable[CaseTriage]) -> dict[TriageVerdict, int]:
    """Cases per verdict, every verdict listed."""
    found = Counter(c.verdict for c in cases)
    return {v: found.get(v, 0) for v in TriageVerdict}


class TriageReport(_Model):
    """The week's triage: ``report/triage.json`` of the run."""

    schema_: Literal["avsim/triage/v1"] = Field(default=TRIAGE_SCHEMA, alias="schema")
    run_key: str = Field(min_length=1)
    iso_week: str = ""
    build_digest: str = ""
    previous_run_key: str = ""
    previous_build_digest: str = ""
    #: Why nothing was triaged (no previous week, the canary stopped the build), said once.
    message: str = ""
    budget_gpu_seconds: float = Field(default=0.0, ge=0)
    planned_gpu_seconds: float = Field(default=0.0, ge=0)
    counts: dict[TriageVerdict, int]
    cases: tuple[CaseTriage, ...] = ()
    audit: DeterminismAudit | None = None
    #: Newly passing cases rerun to confirm the pass (none unless configured).
    confirmations: tuple[Confirmation, ...] = ()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _counts_match(self) -> TriageReport:
        if self.counts != verdict_counts(self.cases):
            raise ValueError(f"counts {self.counts} do not match the cases' verdicts")
        return self

    @classmethod
    def of(cls, run_key: str, cases: Iterable[CaseTriage], **rest: Any) -> TriageReport:
        listed = tuple(cases)
        return cls(run_key=run_key, cases=listed, counts=verdict_counts(listed), **rest)

    @property
    def regressions(self) -> tuple[CaseTriage, ...]:
        return tuple(c for c in self.cases if c.verdict is TriageVerdict.REGRESSION)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=1)
