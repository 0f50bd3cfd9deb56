"""The weekly report page's building blocks: its CSS, cell and table formatting, outcome cards,
the tables of failures and durations, the plots and the progress note (:mod:`avsim.report.html`
puts them together)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from avsim.contracts.week import NOT_STARTED
from avsim.phases.contract import NOT_RUN, Outcome
from avsim.report.build import CASE_OUTCOMES, PHASE_OUTCOMES
from avsim.report.plots import COLOURS, PLOTS_NEED

#: The failed-cases table lists at most this many rows; report.json has them all.
MAX_FAILED_ROWS = 2000
#: The comparison tables list at most this many rows each; report.json has more.
MAX_COMPARED_ROWS = 500
#: Outcome cards shown even at zero; the rarer classes only when they occurred.
ALWAYS_SHOWN = tuple(
    o.value for o in (Outcome.PASSED, Outcome.SCENARIO_FAILED, Outcome.BAD_INPUT, Outcome.INFRA_FAILED)
)
PLOT_CAPTIONS = {
    "progress": "Cases finished over time against the planned pace and the deadline; GPUs busy",
    "durations": "Duration of each phase (box: quartiles, whiskers: 5th-95th percentile)",
    "failures": "Failed cases by class and failing phase",
}

CSS = """
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
figure{margin:0 0 14px;background:#fff;box-shadow:0 1px 2px #0002;padding:8px;display:inline-block}
figure img{max-width:100%}
figcaption{color:#5b6475;font-size:12px}
.zero{color:#b7bcc6}
.note{color:#5b6475}
"""
#: Each class the page shows -> its colour: an attempt's class in its plot's colour, a phase that
#: never ran (upstream failed, not run) as an infrastructure failure, a case the week never started
#: in the notes' neutral grey.
CLASS_COLOURS = {
    **COLOURS,
    Outcome.UPSTREAM_FAILED.value: COLOURS[Outcome.INFRA_FAILED.value],
    NOT_RUN: COLOURS[Outcome.INFRA_FAILED.value],
    NOT_STARTED: "#5b6475",
}
CSS += "".join(f".{cls}{{color:{colour}}}" for cls, colour in CLASS_COLOURS.items()) + "\n"


def fmt(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cell(value: Any, cls: str = "") -> str:
    attr = f' class="{escape(cls)}"' if cls else ""
    return f"<td{attr}>{escape(fmt(value))}</td>"


def html_table(head: Iterable[str], rows: Iterable[str], num_from: int = 99) -> str:
    ths = "".join(f"<th{' class=num' if i >= num_from else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def link(uri: str) -> str:
    if not uri:
        return "—"
    text = escape(uri)
    if uri.startswith(("file://", "http://", "https://")):
        return f'<a href="{escape(uri, quote=True)}">{text}</a>'
    return f"<code>{text}</code>"


def cards(totals: Mapping[str, Any]) -> str:
    shown = [o for o in CASE_OUTCOMES if o in ALWAYS_SHOWN or totals.get(o)]
    items = [("cases", "cases"), *((o, o.replace("_", " ")) for o in shown)]
    if totals.get("missing"):
        items.append(("missing", "missing (no summary)"))
    cards = [
        f'<div class="card"><div class="n {escape(key)}">{escape(fmt(totals.get(key, 0)))}</div>'
        f'<div class="l">{escape(label)}</div></div>'
        for key, label in items
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def outcome_table(table: Mapping[str, Mapping[str, int]]) -> str:
    present = [o for o in PHASE_OUTCOMES if any(o in per for per in table.values())]
    extra = sorted({o for per in table.values() for o in per} - set(PHASE_OUTCOMES))
    columns = [*present, *extra]
    rows = []
    for phase, per in table.items():
        cells = "".join(
            f'<td class="num {escape(o) if per.get(o) else "zero"}">{escape(fmt(per.get(o, 0)))}</td>'
            for o in columns
        )
        total = fmt(sum(per.values()))
        rows.append(f"<tr><td>{escape(phase)}</td>{cells}<td class=num>{escape(total)}</td></tr>")
    return html_table(["phase", *(c.replace("_", " ") for c in columns), "total"], rows, num_from=1)


def failed_table(failed: list[Mapping[str, Any]]) -> str:
    if not failed:
        return '<p class="note">No failed cases.</p>'
    rows = [
        "<tr>"
        + cell(f.get("case_id"))
        + cell(f.get("graph"))
        + cell(f.get("outcome"), str(f.get("outcome", "")))
        + cell(f.get("phase"))
        + cell(f.get("attempt"), "num")
        + cell(f.get("reason"), "reason")
        + f"<td>{link(str(f.get('output_uri') or ''))}</td></tr>"
        for f in failed[:MAX_FAILED_ROWS]
    ]
    more = len(failed) - MAX_FAILED_ROWS
    note = f'<p class="note">… and {more:,} more in report.json.</p>' if more > 0 else ""
    return html_table(["case", "graph", "outcome", "phase", "attempt", "reason", "output"], rows) + note


def duration_table(durations: Mapping[str, Mapping[str, Any]]) -> str:
    if not durations:
        return '<p class="note">No phase has finished yet.</p>'
    keys = ("count", "mean", "p50", "p95", "max")
    rows = [
        f"<tr><td>{escape(phase)}</td>{''.join(cell(stats.get(k), 'num') for k in keys)}</tr>"
        for phase, stats in durations.items()
    ]
    return html_table(["phase", "count", "mean s", "p50 s", "p95 s", "max s"], rows, num_from=1)


def plots(files: Mapping[str, Any]) -> str:
    plots: Mapping[str, str] = files.get("plots") or {}
    if files.get("plots_missing"):
        return f'<p class="note">No plot: {escape(PLOTS_NEED)}.</p>'
    if not plots:
        return '<p class="note">No plot: no phase has finished yet.</p>'
    return "".join(
        f'<figure><img src="{escape(name, quote=True)}" alt="{escape(PLOT_CAPTIONS.get(key, key))}">'
        f"<figcaption>{escape(PLOT_CAPTIONS.get(key, key))}</figcaption></figure>"
        for key, name in plots.items()
    )


def progress_note(progress: Mapping[str, Any]) -> str:
    """One line under the plots: finished against the planned pace, peak GPUs, and what they mean."""
    if not progress or not progress.get("start"):
        return ""
    ahead = progress.get("ahead_by_cases")
    planned, finished = progress.get("planned_cases"), progress.get("finished_cases")
    # A week that ended with cases unfinished (stopped by the canary gate, say) is not "ahead":
    # the report makes no pace claim for it, as the run page makes none for an ended run.
    stopped = isinstance(planned, int) and isinstance(finished, int) and finished < planned
    pace = (
        f" · planned pace by then {fmt(progress.get('planned_by_now'))} "
        f"({'ahead' if ahead >= 0 else 'behind'} by {fmt(abs(ahead))} cases)"
        if isinstance(ahead, int | float) and not stopped
        else ""
    )
    defs: Mapping[str, Any] = progress.get("definitions") or {}
    meaning = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in defs.items())
    return (
        f'<p class="note" id="progress-note">{escape(fmt(progress.get("finished_cases")))} of '
        f"{escape(fmt(progress.get('planned_cases')))} cases finished at "
        f"<code>{escape(fmt(progress.get('now')))}</code>{escape(pace)} · "
        f"at most {escape(fmt(progress.get('peak_gpus')))} GPUs busy at once. {escape(meaning)}.</p>"
    )
