"""Which endings need an engineer, and the one-line verdicts of a shard run and of a week.

Passed cases and failed scenarios are results and never turn anything red; every other ending needs
attention. A shard run fails (its ``summarize``, after writing the summary) when a case needs attention,
and the parent's ``shards`` map index with it; a week fails (its ``report``, after writing the report)
when a case needs attention or cases never started. Pure functions of the shard summaries: no Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from avsim.contracts.week import NOT_STARTED, CaseSummary, PhaseSummary, ShardSummary
from avsim.phases.contract import (
    ENDED,
    FAILURE_ORDER,
    PHASES_GIVING,
    RESULTS,
    Outcome,
    values,
)

#: Case outcomes that need an engineer, most specific first (the order lines list them in).
NEEDS_ATTENTION = values(tuple(o for o in FAILURE_ORDER if o not in RESULTS))
#: Every case outcome, results first (the order counts list them in).
CASE_OUTCOMES = values(ENDED)
#: How many case/phase pairs a line names.
EXAMPLES = 3


def needs_attention(case_outcome: str) -> bool:
    """Whether a case that ended with ``case_outcome`` needs an engineer (anything but a result)."""
    return case_outcome not in values(RESULTS)


def failing_phase(case: CaseSummary) -> tuple[str, PhaseSummary | None]:
    """The phase that gave a failed case its class: the first one in phase order with a phase class
    that gives it (:data:`avsim.phases.contract.PHASES_GIVING`); ("", None) when none does."""
    wanted = (
        PHASES_GIVING.get(case.outcome, (case.outcome_name,)) if isinstance(case.outcome, Outcome) else ()
    )
    for target in wanted:  # an infra failure beats the not-run phases it caused
        for name, entry in case.phases.items():
            if entry.outcome_name == target:
                return name, entry
    return "", None


def _counted(counts: Mapping[str, int]) -> str:
    order = [*NEEDS_ATTENTION, *sorted(set(counts) - set(NEEDS_ATTENTION))]
    return ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))


@dataclass(frozen=True)
class ShardVerdict:
    """A shard run's cases that need attention: their counts by class and the first few of them."""

    shard: int
    cases: int
    counts: Mapping[str, int] = field(default_factory=dict)
    #: (case id, failing phase) of the first cases that need attention, in the summary's order.
    examples: tuple[tuple[str, str], ...] = ()
    #: Cases of a shard run the week never started (their summary says why).
    not_started: int = 0

    @property
    def attention(self) -> int:
        return sum(self.counts.values())

    @property
    def needs_attention(self) -> bool:
        return self.attention > 0

    @property
    def label(self) -> str:
        """A short suffix for the grid's map-index label: empty when nothing needs attention."""
        return f" · {self.attention} need attention" if self.needs_attention else ""

    def line(self) -> str:
        """One line for a log or a failure message."""
        if not self.needs_attention:
            return (
                f"shard {self.shard}: all {self.cases} cases ended with a result (passed or scenario_failed)"
            )
        shown = ", ".join(f"{case}/{phase or '?'}" for case, phase in self.examples)
        more = (
            f" and {self.attention - len(self.examples)} more" if self.attention > len(self.examples) else ""
        )
        return (
            f"shard {self.shard}: {self.attention} of {self.cases} cases need attention "
            f"({_counted(self.counts)}): {shown}{more}"
        )


def shard_verdict(summary: ShardSummary) -> ShardVerdict:
    """The verdict of one shard summary."""
    counts: dict[str, int] = {}
    examples: list[tuple[str, str]] = []
    not_started = 0
    for case in summary.cases:
        outcome = case.outcome_name
        if outcome == NOT_STARTED:
            not_started += 1
            continue
        if not needs_attention(outcome):
            continue
        counts[outcome] = counts.get(outcome, 0) + 1
        if len(examples) < EXAMPLES:
            examples.append((case.case_id, failing_phase(case)[0]))
    return ShardVerdict(summary.shard, len(summary.cases), counts, tuple(examples), not_started)


@dataclass(frozen=True)
class WeekVerdict:
    """A week's verdict: what needs attention across its shards, and whether it was stopped."""

    shards: tuple[ShardVerdict, ...]
    #: Cases the week never started, and why (empty when every case ran).
    not_started: int = 0
    stopped_because: str = ""

    @property
    def attention(self) -> int:
        return sum(s.attention for s in self.shards)

    @property
    def needs_attention(self) -> bool:
        return self.attention > 0 or self.not_started > 0

    @property
    def state(self) -> str:
        if self.not_started:
            return "stopped"
        return "needs_attention" if self.attention else "passed"

    def line(self) -> str:
        counts: dict[str, int] = {}
        for s in self.shards:
            for k, v in s.counts.items():
                counts[k] = counts.get(k, 0) + v
        parts = []
        if self.not_started:
            parts.append(
                f"the week was stopped: {self.not_started} cases never started ({self.stopped_because})"
            )
        failed = [s for s in self.shards if s.needs_attention]
        if failed:
            named = ", ".join(str(s.shard) for s in failed[:8]) + (" …" if len(failed) > 8 else "")
            parts.append(
                f"{self.attention} cases need attention ({_counted(counts)}) in shard(s) {named}; "
                "clear the weekly run's failed task instances (Clear → Only failed) to rerun them"
            )
        return "; ".join(parts) if parts else "every case ended with a result (passed or scenario_failed)"

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "line": self.line(),
            "attention": self.attention,
            "not_started": self.not_started,
            "stopped_because": self.stopped_because,
            "shards": {str(s.shard): dict(s.counts) for s in self.shards if s.needs_attention},
        }


def week_verdict(
    summaries: Iterable[ShardSummary], *, not_started: int = 0, stopped_because: str = ""
) -> WeekVerdict:
    """The week's verdict from its shard summaries (a shard summarized twice counts once: the last).

    ``not_started``: cases no summary covers; with the ``not_started`` cases of the summaries of shard
    runs that never started (:func:`avsim.ledger.summaries.unstarted_shard_summary`), the week was stopped.
    """
    summaries = list(summaries)
    by_shard = {s.shard: shard_verdict(s) for s in summaries}
    never = max(0, not_started) + sum(v.not_started for v in by_shard.values())
    why = stopped_because or next((s.stopped_because for s in summaries if s.stopped_because), "")
    return WeekVerdict(
        tuple(by_shard[k] for k in sorted(by_shard)),
        not_started=never,
        stopped_because=why if never > 0 else "",
    )
