"""Shard summaries: what a shard's cases came to, from the ledger's committed outcomes.

A shard run's ``summarize`` writes one (:func:`summarize_shard`); ``close_week`` writes one for a
shard run the week never started (:func:`unstarted_shard_summary`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from avsim.contracts.week import NOT_RUN, NOT_STARTED, CaseSummary, PhaseSummary, ShardSummary
from avsim.phases.contract import Outcome, case_class

if TYPE_CHECKING:
    from avsim.ledger.records import AttemptRecord
    from avsim.ledger.store import Ledger


def _when(ran: AttemptRecord | None) -> dict[str, Any]:
    """When an attempt ran and the GPUs it held, as a phase's summary carries them (the report's case
    times and progress plot read them)."""
    if ran is None:
        return {}
    return {"started_at": ran.started_at, "ended_at": ran.ended_at, "gpus": ran.gpus}


def summarize_shard(ledger: Ledger, shard: int, cases: list[dict[str, Any]]) -> ShardSummary:
    """A shard's summary from the committed outcomes of its cases' phases.

    ``cases``: ``{"case_id", "graph", "phases": [phase, ...] in topological order}``, optionally
    ``"depends_on": {phase: [upstream, ...]}``; without it every earlier phase counts as upstream.
    A phase without a committed outcome is ``upstream_failed`` when an upstream of it produced no
    output, else ``not_run``. A case takes :func:`avsim.phases.contract.case_class` of its phases.
    """
    keys = [(str(c["case_id"]), str(p)) for c in cases for p in c["phases"]]
    states = ledger.phase_states(keys)
    out = []
    for case in cases:
        cid = str(case["case_id"])
        order = [str(p) for p in case["phases"]]
        deps = case.get("depends_on")
        phases: dict[str, PhaseSummary] = {}
        for i, phase in enumerate(order):
            committed, attempts = states[(cid, phase)]
            if committed is not None:
                ran = next((a for a in attempts if a.attempt == committed.attempt), None)
                entry = PhaseSummary(
                    outcome=committed.outcome,
                    attempt=committed.attempt,
                    output_uri=committed.output_uri,
                    reason=committed.reason,
                    duration_seconds=ran.duration_seconds if ran else None,
                    attempts=len(attempts),
                    **_when(ran),
                )
            else:
                ups = deps.get(phase, []) if isinstance(deps, dict) else order[:i]
                blocked = any(not _produced_output(phases.get(u)) for u in ups)
                last = attempts[-1] if attempts else None
                entry = PhaseSummary(
                    outcome=Outcome.UPSTREAM_FAILED if blocked else NOT_RUN,
                    attempt=last.attempt if last else None,
                    reason=last.reason if last else "",
                    duration_seconds=last.duration_seconds if last else None,
                    attempts=len(attempts),
                    **_when(last),
                )
            phases[phase] = entry
        out.append(
            CaseSummary(
                case_id=cid,
                graph=str(case.get("graph", "")),
                outcome=case_class(e.outcome for e in phases.values()),
                phases=phases,
            )
        )
    return ShardSummary(shard=shard, cases=tuple(out))


def _produced_output(phase: PhaseSummary | None) -> bool:
    """Whether a phase of the summary produced output its downstream phases can consume."""
    return phase is not None and isinstance(phase.outcome, Outcome) and phase.outcome.produced_output


def unstarted_shard_summary(shard: int, cases: list[dict[str, Any]], why: str) -> ShardSummary:
    """The summary of a shard run the week never started: every case ``not_started``, and why.

    Written in place of the shard's summary after the week's shards ended, so the run-level phases
    and the report account for every case of a stopped week; a shard run started later (after a
    repair) replaces it with its own summary.
    """
    return ShardSummary(
        shard=shard,
        started=False,
        stopped_because=why,
        verdict=f"shard {shard}: never started ({why})",
        cases=tuple(
            CaseSummary(case_id=str(c["case_id"]), graph=str(c.get("graph", "")), outcome=NOT_STARTED)
            for c in cases
        ),
        counts={"cases": len(cases), NOT_STARTED: len(cases)},
    )
