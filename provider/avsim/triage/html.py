"""The weekly report's "Regressions" section, which opens its page: the week's triage as HTML."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from avsim.triage.model import TriageReport, TriageVerdict

_WORD = {"passed": "pass", "scenario_failed": "fail"}
_ORDER = {v: i for i, v in enumerate(TriageVerdict)}


def _link(uri: str, text: str) -> str:
    if uri.startswith(("file://", "http://", "https://")):
        return f'<a href="{escape(uri, quote=True)}">{escape(text)}</a>'
    return escape(text)


def _reruns(case: Mapping[str, Any]) -> str:
    cells = []
    for r in sorted(case.get("reruns") or (), key=lambda r: (r["build"] != "this", r["index"])):
        side = "this build" if r["build"] == "this" else "last week's"
        word = _WORD.get(str(r.get("outcome")), str(r.get("outcome") or "not started"))
        cells.append(f"{escape(side)} #{r['index']}: " + _link(str(r.get("output_uri") or ""), word))
    return "<br>".join(cells) or "—"


def triage_section(doc: Mapping[str, Any] | None) -> str:
    """The section for a triage document (``report.json``'s ``triage``), or "" when there is none."""
    if not isinstance(doc, Mapping):
        return ""
    triage = TriageReport.model_validate(doc)
    counts = " · ".join(
        f"{escape(v.value.replace('_', ' '))} <b>{triage.counts.get(v, 0)}</b>" for v in TriageVerdict
    )
    parts = [f'<h2>Regressions</h2><p id="triage">{counts}</p>']
    if triage.message:
        parts.append(f'<p class="note">{escape(triage.message)}</p>')
    rows = []
    for c in sorted(triage.cases, key=lambda c: (_ORDER[c.verdict], c.case_id)):
        data = c.model_dump(mode="json")
        rows.append(
            f'<tr class="{escape(c.verdict.value)}"><td>{escape(c.verdict.value.replace("_", " "))}</td>'
            f"<td><code>{escape(c.case_id)}</code></td><td>{escape(c.scenario_uri or '—')}</td>"
            f"<td>{escape(c.failing_phase)}</td><td>{_reruns(data)}</td><td>{escape(c.reason)}</td></tr>"
        )
    if rows:
        head = "".join(
            f"<th>{h}</th>" for h in ("verdict", "case", "scenario", "failing phase", "reruns", "why")
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    audit = triage.audit
    if audit is not None:
        differing = sorted({d.case_id for d in audit.differing})
        parts.append(
            f'<p class="note" id="determinism">Determinism audit: {len(audit.sampled)} of {audit.passed_cases} '
            f"passed cases rerun with the same seed; {len(differing)} gave different outputs "
            f"({audit.rate:.1%}){': ' + escape(', '.join(differing)) if differing else ''}.</p>"
        )
    if triage.confirmations:
        ok = sum(1 for c in triage.confirmations if c.confirmed)
        missed = ", ".join(c.case_id for c in triage.confirmations if not c.confirmed)
        parts.append(
            f'<p class="note" id="confirmations">Newly passing cases rerun on this build: {ok} of '
            f"{len(triage.confirmations)} passed again{': not ' + escape(missed) if missed else ''}.</p>"
        )
    return "\n".join(parts)
