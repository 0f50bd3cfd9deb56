"""The triage document as text: a counts line, one row per case (regressions first), the audit."""

from __future__ import annotations

from avsim.phases.contract import Outcome
from avsim.triage.model import BuildSide, CaseTriage, Rerun, TriageReport, TriageVerdict

_ORDER = {v: i for i, v in enumerate(TriageVerdict)}
_WORD = {Outcome.PASSED: "pass", Outcome.SCENARIO_FAILED: "fail"}
HEADER = ("verdict", "case", "phase", "reruns this | last", "reason")


def _short(digest: str) -> str:
    return digest[:19] if digest.startswith("sha256:") else digest or "?"


def _reruns(case: CaseTriage) -> str:
    def words(side: BuildSide) -> str:
        mine: list[Rerun] = sorted((r for r in case.reruns if r.build is side), key=lambda r: r.index)
        return " ".join(_WORD.get(r.outcome, r.outcome.value) if r.outcome else "not-started" for r in mine)

    return f"{words(BuildSide.THIS) or '-'} | {words(BuildSide.LAST) or '-'}" if case.reruns else "-"


def counts_line(report: TriageReport) -> str:
    return " · ".join(f"{v.value.replace('_', ' ')} {report.counts.get(v, 0)}" for v in TriageVerdict)


def audit_lines(report: TriageReport) -> list[str]:
    audit = report.audit
    if audit is None:
        return []
    differing = sorted({d.case_id for d in audit.differing})
    lines = [
        f"determinism audit: {len(audit.sampled)} of {audit.passed_cases} passed cases rerun, "
        f"{len(differing)} with different outputs ({audit.rate:.1%})"
    ]
    lines += [f"  {d.case_id} {d.phase}/{d.output}: {d.first} -> {d.again}" for d in audit.differing]
    return lines


def confirmation_lines(report: TriageReport) -> list[str]:
    if not report.confirmations:
        return []
    ok = sum(1 for c in report.confirmations if c.confirmed)
    lines = [f"newly passing confirmed: {ok} of {len(report.confirmations)} rerun on this build"]
    lines += [
        f"  {c.case_id}: {c.outcome.value if c.outcome else 'no result'} {c.reason}".rstrip()
        for c in report.confirmations
        if not c.confirmed
    ]
    return lines


def render(report: TriageReport) -> str:
    """The whole document as a table for a terminal."""
    head = f"triage of {report.run_key}"
    if report.iso_week:
        head += f" ({report.iso_week})"
    if report.build_digest or report.previous_build_digest:
        head += f": build {_short(report.build_digest)} against {_short(report.previous_build_digest)}"
    lines = [head, counts_line(report)]
    if report.message:
        lines.append(report.message)
    cases = sorted(report.cases, key=lambda c: (_ORDER[c.verdict], c.case_id))
    rows = [HEADER] + [(c.verdict.value, c.case_id, c.failing_phase, _reruns(c), c.reason) for c in cases]
    if cases:
        widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
        lines += ["  ".join([*(r[i].ljust(widths[i]) for i in range(len(widths))), r[-1]]) for r in rows]
    return "\n".join([*lines, *audit_lines(report), *confirmation_lines(report)])
