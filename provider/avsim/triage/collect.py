"""Reading triage's shard runs back: each rerun's outcome, each case's verdict, the audit's digests.

The ``triage`` task calls :func:`collect` once its runs ended (or the deadline came): a run without
a summary did not end, and its cases are listed as not triaged, with that reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from avsim.artifacts import RunLayout
from avsim.contracts.week import CaseSummary, ShardSummary
from avsim.phases.contract import Outcome
from avsim.triage import decide
from avsim.triage.model import (
    CaseTriage,
    Confirmation,
    DeterminismAudit,
    OutputDifference,
    Rerun,
    TriageReport,
)
from avsim.triage.runs import TRIAGE_SHARD, TriageBook, TriageRun

#: A run's summary, by its run key (None: the run has not written one: it did not end).
SummaryOf = Callable[[str], ShardSummary | None]
#: The sha256 of a stored file (None: it does not exist).
DigestOf = Callable[[str], str | None]


def file_digest(uri: str) -> str | None:
    from avsim.storage import exists, path

    if not exists(uri):
        return None
    return "sha256:" + hashlib.sha256(path(uri).read_bytes()).hexdigest()


def summary_of_run(root: str) -> SummaryOf:
    from avsim.ledger.store import Ledger

    return lambda run_key: Ledger(RunLayout(root, run_key)).shard_summary(TRIAGE_SHARD)


def _rerun(
    run: TriageRun, case_id: str, case: CaseSummary | None, failing_phase: str, why_missing: str
) -> Rerun:
    digest = run.image.rpartition("@")[2]
    if case is None:
        return Rerun(
            case_id=case_id, build=run.build, build_digest=digest, index=run.index, reason=why_missing
        )
    entry = case.phases.get(failing_phase)
    outcome = case.outcome if isinstance(case.outcome, Outcome) else None
    reason = entry.reason if entry is not None else ""
    if outcome is None:
        reason = reason or f"the rerun's case ended {case.outcome_name}"
    return Rerun(
        case_id=case_id,
        build=run.build,
        build_digest=digest,
        index=run.index,
        outcome=outcome,
        reason=reason[:300],
        output_uri=entry.output_uri if entry is not None else "",
    )


def _cases(summary: ShardSummary | None) -> dict[str, CaseSummary]:
    return {c.case_id: c for c in summary.cases} if summary is not None else {}


def collect(
    book: TriageBook,
    week: Mapping[str, CaseSummary],
    head: Mapping[str, Any],
    *,
    summary_of: SummaryOf,
    digest_of: DigestOf = file_digest,
    reruns: int = decide.RERUNS,
    why_unfinished: str = "its triage run did not end before the report",
) -> TriageReport:
    """The week's triage document from the book's runs (``week``: the week's cases by id)."""
    summaries = {run.run_key: summary_of(run.run_key) for run in book.runs}
    triaged: dict[str, CaseTriage] = {}  # a later round's verdict replaces an earlier one's
    for rnd in book.rounds:
        failing = {c.case_id: c.failing_phase for c in rnd.chosen}
        found: list[Rerun] = []
        unfinished: set[str] = set()
        for run in rnd.runs:
            summary = summaries[run.run_key]
            cases = _cases(summary)
            for case_id in run.cases:
                if summary is None:
                    unfinished.add(case_id)
                    continue
                found.append(
                    _rerun(
                        run, case_id, cases.get(case_id), failing[case_id], "the case is missing from its run"
                    )
                )
        for c in rnd.chosen:
            if c.case_id in unfinished:
                triaged[c.case_id] = c.not_triaged(why_unfinished)
            else:
                triaged[c.case_id] = decide.triage_case(c, found, reruns)
        for n in rnd.not_triaged:
            triaged[n.case_id] = n
    return TriageReport.of(
        book.week_run_key,
        sorted(triaged.values(), key=lambda c: c.case_id),
        iso_week=book.iso_week,
        build_digest=book.build_digest,
        previous_run_key=book.previous_run_key,
        previous_build_digest=book.previous_build_digest,
        message=book.message,
        budget_gpu_seconds=sum(r.budget_gpu_seconds for r in book.rounds[:1]),
        planned_gpu_seconds=sum(r.planned_gpu_seconds for r in book.rounds),
        audit=_audit(book, week, head, summaries, digest_of),
        confirmations=_confirmations(book, summaries),
    )


def _confirmations(
    book: TriageBook, summaries: Mapping[str, ShardSummary | None]
) -> tuple[Confirmation, ...]:
    """Each newly passing case's confirmation rerun: its class, or why it has none."""
    found: list[Confirmation] = []
    for run in (r for r in book.runs if r.confirm):
        cases = _cases(summaries[run.run_key])
        for case_id in run.confirm:
            case = cases.get(case_id)
            if case is None:
                found.append(Confirmation(case_id=case_id, reason="its rerun did not end before the report"))
                continue
            outcome = case.outcome if isinstance(case.outcome, Outcome) else None
            failed = next((p for p in case.phases.values() if p.outcome_name != "passed"), None)
            found.append(
                Confirmation(
                    case_id=case_id,
                    outcome=outcome,
                    reason=(failed.reason if failed else "")[:300] or ("" if outcome else case.outcome_name),
                    output_uri=failed.output_uri if failed else "",
                )
            )
    return tuple(found)


def declared_outputs(head: Mapping[str, Any], graph: str) -> dict[str, list[str]]:
    """Phase -> the deterministic outputs its spec declares, for one graph of the run's head."""
    phases = ((head.get("graphs") or {}).get(graph) or {}).get("phases") or {}
    return {
        name: list(spec.get("deterministic_outputs") or ())
        for name, spec in phases.items()
        if spec.get("deterministic_outputs")
    }


def _digests(
    case: CaseSummary, declared: Mapping[str, list[str]], digest_of: DigestOf
) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for phase, outputs in declared.items():
        entry = case.phases.get(phase)
        if entry is None or not entry.output_uri:
            continue
        for name in outputs:
            digest = digest_of(f"{entry.output_uri.rstrip('/')}/{name}")
            if digest is not None:
                out.setdefault(phase, {})[name] = digest
    return out


def _audit(
    book: TriageBook,
    week: Mapping[str, CaseSummary],
    head: Mapping[str, Any],
    summaries: Mapping[str, ShardSummary | None],
    digest_of: DigestOf,
) -> DeterminismAudit | None:
    first = book.rounds[0] if book.rounds else None
    if first is None or not first.audit:
        return None
    run = next(r for r in first.runs if r.audit)
    again = _cases(summaries[run.run_key])
    differing: list[OutputDifference] = []
    sampled: list[str] = []
    for case_id in first.audit:
        ran, before = again.get(case_id), week.get(case_id)
        if ran is None or before is None or ran.outcome is not Outcome.PASSED:
            continue  # the rerun did not pass (or did not end): no output to compare
        sampled.append(case_id)
        declared = declared_outputs(head, before.graph)
        differing += decide.differing_outputs(
            case_id, declared, _digests(before, declared, digest_of), _digests(ran, declared, digest_of)
        )
    return DeterminismAudit.of(first.passed_cases, sampled, differing)
