"""The weekly report as one self-contained HTML page: inline CSS, no script, no external assets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from avsim.report.build import CASE_OUTCOMES, PHASE_OUTCOMES

#: The failed-cases table lists at most this many rows; report.json has them all.
MAX_FAILED_ROWS = 2000

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0}
body{color:#1d2330;background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#c5cad6;font-size:13px}
header code{color:#fff}
main{padding:18px 28px;max-width:1400px}
h2{font-size:17px;margin:26px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border-radius:8px;padding:12px 18px;min-width:130px;box-shadow:0 1px 2px #0002}
.card .n{font-size:26px;font-weight:600}
.card .l{color:#5b6475;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin-bottom:8px}
th,td{padding:6px 10px;border-bottom:1px solid #e6e8ec;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.reason{max-width:560px;word-break:break-word;color:#3d4657}
.passed{color:#1c7c3c}.scenario_failed{color:#b35c00}.bad_input{color:#a1127b}
.infra_failed,.upstream_failed,.not_run{color:#c0262d}
.zero{color:#b7bcc6}
.note{color:#5b6475}
"""


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell(value: Any, cls: str = "") -> str:
    attr = f' class="{escape(cls)}"' if cls else ""
    return f"<td{attr}>{escape(_fmt(value))}</td>"


def _table(head: Iterable[str], rows: Iterable[str], num_from: int = 99) -> str:
    ths = "".join(f"<th{' class=num' if i >= num_from else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _link(uri: str) -> str:
    if not uri:
        return "—"
    text = escape(uri)
    if uri.startswith(("file://", "http://", "https://")):
        return f'<a href="{escape(uri, quote=True)}">{text}</a>'
    return f"<code>{text}</code>"


def _cards(totals: Mapping[str, Any]) -> str:
    items = [("cases", "cases"), *((o, o.replace("_", " ")) for o in CASE_OUTCOMES)]
    if totals.get("missing"):
        items.append(("missing", "missing (no summary)"))
    cards = [
        f'<div class="card"><div class="n {escape(key)}">{escape(_fmt(totals.get(key, 0)))}</div>'
        f'<div class="l">{escape(label)}</div></div>'
        for key, label in items
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _outcome_table(table: Mapping[str, Mapping[str, int]]) -> str:
    present = [o for o in PHASE_OUTCOMES if any(o in per for per in table.values())]
    extra = sorted({o for per in table.values() for o in per} - set(PHASE_OUTCOMES))
    columns = [*present, *extra]
    rows = []
    for phase, per in table.items():
        cells = "".join(
            f'<td class="num {escape(o) if per.get(o) else "zero"}">{escape(_fmt(per.get(o, 0)))}</td>'
            for o in columns
        )
        total = _fmt(sum(per.values()))
        rows.append(f"<tr><td>{escape(phase)}</td>{cells}<td class=num>{escape(total)}</td></tr>")
    return _table(["phase", *(c.replace("_", " ") for c in columns), "total"], rows, num_from=1)


def _failed_table(failed: list[Mapping[str, Any]]) -> str:
    if not failed:
        return '<p class="note">No failed cases.</p>'
    rows = [
        "<tr>"
        + _cell(f.get("case_id"))
        + _cell(f.get("graph"))
        + _cell(f.get("outcome"), str(f.get("outcome", "")))
        + _cell(f.get("phase"))
        + _cell(f.get("attempt"), "num")
        + _cell(f.get("reason"), "reason")
        + f"<td>{_link(str(f.get('output_uri') or ''))}</td></tr>"
        for f in failed[:MAX_FAILED_ROWS]
    ]
    more = len(failed) - MAX_FAILED_ROWS
    note = f'<p class="note">… and {more:,} more in report.json.</p>' if more > 0 else ""
    return _table(["case", "graph", "outcome", "phase", "attempt", "reason", "output"], rows) + note


def _duration_table(durations: Mapping[str, Mapping[str, Any]]) -> str:
    if not durations:
        return '<p class="note">No phase has finished yet.</p>'
    keys = ("count", "mean", "p50", "p95", "max")
    rows = [
        f"<tr><td>{escape(phase)}</td>{''.join(_cell(stats.get(k), 'num') for k in keys)}</tr>"
        for phase, stats in durations.items()
    ]
    return _table(["phase", "count", "mean s", "p50 s", "p95 s", "max s"], rows, num_from=1)


def render_html(report: Mapping[str, Any]) -> str:
    """The page for ``report`` (as built by :func:`avsim.report.build.build_report`)."""
    run: Mapping[str, Any] = report.get("run") or {}
    build: Mapping[str, Any] = report.get("build") or {}
    totals: Mapping[str, Any] = report.get("totals") or {}
    phases: Mapping[str, Any] = report.get("phase_outcomes") or {}
    attempts: Mapping[str, Any] = report.get("attempts") or {}
    title = (
        f"avsim weekly report: {run.get('name') or report.get('run_id')} {run.get('iso_week') or ''}".strip()
    )
    meta = [
        ("week", run.get("iso_week")),
        ("run class", run.get("run_class")),
        ("deadline", run.get("deadline")),
        ("build", build.get("build_id")),
        ("image", build.get("image")),
        ("run", report.get("run_id")),
        ("manifest sha256", report.get("manifest_sha256")),
        ("generated", report.get("generated_at")),
    ]
    meta_html = " · ".join(f"{escape(k)} <code>{escape(_fmt(v))}</code>" for k, v in meta if v)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f'<header><h1>{escape(title)}</h1><div class="meta">{meta_html}</div></header><main>',
        "<h2>Cases</h2>",
        _cards(totals),
        f'<p class="note">{escape(_fmt(totals.get("shards", 0)))} shard summaries · '
        f"{escape(_fmt(attempts.get('total', 0)))} attempts · "
        f"{escape(_fmt(attempts.get('retried_phases', 0)))} phases retried · "
        f"at most {escape(_fmt(attempts.get('max_attempts', 0)))} attempts of one phase</p>",
        "<h2>Phase outcomes</h2>",
        _outcome_table(phases.get("overall") or {}),
    ]
    by_graph: Mapping[str, Any] = phases.get("by_graph") or {}
    if len(by_graph) > 1:
        for graph, table in by_graph.items():
            parts += [
                f"<h2>Phase outcomes: graph {escape(graph or '(own phases)')}</h2>",
                _outcome_table(table),
            ]
    run_phases: Mapping[str, Any] = report.get("run_phases") or {}
    if run_phases:
        rows = [f"<tr><td>{escape(k)}</td>{_cell(v, str(v))}</tr>" for k, v in run_phases.items()]
        parts += ["<h2>Run-level phases</h2>", _table(["phase", "outcome"], rows)]
    failed = list(report.get("failed_cases") or [])
    parts += [
        f"<h2>Failed cases ({escape(_fmt(len(failed)))})</h2>",
        _failed_table(failed),
        "<h2>Durations</h2>",
        _duration_table(report.get("durations") or {}),
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"
